package ops

// Names says how a caller names a request's fields in messages: the
// daemon by their JSON names, the CLI by its flags. A rule's message
// starts with the name, so it reads right to whoever sent the value.
type Names map[string]string

var (
	// JSONFields are the API's names: the fields of api.RestoreRequest and
	// api.ImportRequest.
	JSONFields = Names{
		"snapshot": "snapshot", "device": "device", "prefetch": "prefetch", "policy": "policy", "io_engine": "io_engine",
		"vm_state": "vm_state", "memory": "memory", "alias": "alias", "layout": "layout",
	}
	// Flags are the CLI's names of the same fields.
	Flags = Names{
		"snapshot": "ID|ALIAS", "device": "--device", "prefetch": "--prefetch", "policy": "--policy", "io_engine": "--io-engine",
		"vm_state": "--vm-state", "memory": "--memory", "alias": "--alias", "layout": "--layout",
	}
)

// name is how n says field; the field's own name when n has none.
func (n Names) name(field string) string {
	if s, ok := n[field]; ok {
		return s
	}
	return field
}

// fieldError is err refused in field.
func (n Names) fieldError(field string, err error) *FieldError {
	return &FieldError{Field: field, Name: n.name(field), Err: err}
}

// FieldError names the request field a value was refused in: Field is
// the JSON name (the daemon's 400 names it), Name how the caller said it
// (the message starts with it). The CLI reports it as a usage error.
type FieldError struct {
	Field, Name string
	Err         error
}

func (e *FieldError) Error() string { return e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }
