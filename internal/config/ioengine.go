package config

import (
	"fmt"
	"slices"
	"strconv"
)

// IOEngineSetting is [memory] io_engine: a name (IOEngineNames) or, as
// the seed writes it, the engine's integer.
type IOEngineSetting int

// IOEngineNames are the names of the I/O engines, by integer: 0 and 1
// read through the host page cache (the seed tells them apart below the
// device), 2 is direct I/O.
var IOEngineNames = []string{"buffered", "buffered_async", "direct"}

// String is the engine's name, or its integer when it has none.
func (e IOEngineSetting) String() string {
	if int(e) >= 0 && int(e) < len(IOEngineNames) {
		return IOEngineNames[e]
	}
	return fmt.Sprint(int(e))
}

// UnmarshalTOML takes a name or an integer. An unknown name is an error
// listing the names; an integer out of range is Validate's to name.
func (e *IOEngineSetting) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case int64:
		*e = IOEngineSetting(v)
		return nil
	case string:
		if i := slices.Index(IOEngineNames, v); i >= 0 {
			*e = IOEngineSetting(i)
			return nil
		}
		return fmt.Errorf("%q is not one of %q, %q, %q (or 0, 1, 2)", v, IOEngineNames[0], IOEngineNames[1], IOEngineNames[2])
	}
	return fmt.Errorf("want a name such as %q or an integer, got %T", IOEngineNames[0], v)
}

// Set makes the setting a command-line flag value (pflag.Value) that
// takes what the configuration file takes: a name or an integer.
func (e *IOEngineSetting) Set(s string) error {
	if i, err := strconv.Atoi(s); err == nil {
		*e = IOEngineSetting(i)
		return nil
	}
	return e.UnmarshalTOML(s)
}

// Type names the flag's value in --help.
func (e *IOEngineSetting) Type() string { return "engine" }
