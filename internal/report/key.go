package report

import (
	"fmt"
	"io"
)

// KeyInfo is `key show --json`.
type KeyInfo struct {
	ID        string `json:"id"`
	Algorithm string `json:"algorithm"`
	// Private says the file holds the private key.
	Private bool `json:"private"`
	// PublicKey is the public key as a public key file holds it.
	PublicKey string `json:"public_key"`
}

// Key prints `key show`: a key's id and public key, as JSON or for people.
func Key(w io.Writer, info KeyInfo, asJSON bool) error {
	if asJSON {
		return JSON(w, info)
	}
	kind := "public"
	if info.Private {
		kind = "private"
	}
	_, err := fmt.Fprintf(w, "id:\t%s\nkey:\t%s %s\n%s", info.ID, info.Algorithm, kind, info.PublicKey)
	return err
}
