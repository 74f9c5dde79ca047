package s3

// CheckEndpoint refuses an endpoint Open would refuse, for `config check`.
func CheckEndpoint(endpoint string) error {
	_, _, err := parseEndpoint(endpoint)
	return err
}

// CheckPrefix refuses a prefix Open would refuse, for `config check`.
func CheckPrefix(prefix string) error {
	_, err := normalizePrefix(prefix)
	return err
}
