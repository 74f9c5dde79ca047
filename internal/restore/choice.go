package restore

// FieldError names the request field a restore refused a value in, so the
// daemon can answer 400 naming it and the CLI can exit 2.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }
