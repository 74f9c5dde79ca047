package vmm

// The drivers' keys: what [vmm] driver and --vmm call each driver, and
// what a refusal of another VMM's state tells the operator to use. This is
// their one spelling: each driver's DriverKey, the configuration's values
// (config.Drivers) and the refusal's hint refer to these constants, and a
// test in internal/architecture refuses a driver whose key is spelled
// anywhere else.
const (
	DriverReplay      = "replay"
	DriverFirecracker = "firecracker"
	DriverQEMU        = "qemu"
)

// drivers pairs each driver's key with the state format it restores (and
// writes): every driver restores exactly one format, no two the same.
var drivers = []struct {
	key    string
	format StateFormat
}{
	{DriverReplay, FormatReplay},
	{DriverFirecracker, FormatFirecracker},
	{DriverQEMU, FormatQEMU},
}

// Drivers lists the drivers' keys.
func Drivers() []string {
	keys := make([]string, len(drivers))
	for i, d := range drivers {
		keys[i] = d.key
	}
	return keys
}

// DriverFormat is the state format the driver key restores, or
// FormatUnknown for a key no driver has.
func DriverFormat(key string) StateFormat {
	for _, d := range drivers {
		if d.key == key {
			return d.format
		}
	}
	return FormatUnknown
}

// driverFor is the driver key that restores format f, or "".
func driverFor(f StateFormat) string {
	for _, d := range drivers {
		if d.format == f {
			return d.key
		}
	}
	return ""
}
