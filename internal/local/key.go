package local

import (
	"fmt"

	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/trust"
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

// ShowKey prints the id and public key of the key file at path.
func ShowKey(o report.Output, path string, asJSON bool) error {
	k, err := trust.LoadPublic(path)
	if err != nil {
		return fmt.Errorf("key show: %w", err)
	}
	info := KeyInfo{ID: k.ID(), Algorithm: repository.SignatureAlgorithm, Private: k.Private != nil,
		PublicKey: string(trust.EncodePublic(k.Public))}
	if asJSON {
		return report.JSON(o.Out, info)
	}
	kind := "public"
	if info.Private {
		kind = "private"
	}
	_, err = fmt.Fprintf(o.Out, "id:\t%s\nkey:\t%s %s\n%s", info.ID, info.Algorithm, kind, info.PublicKey)
	return err
}
