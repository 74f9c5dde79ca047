package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/report"
	"warmstart/internal/repository"
	"warmstart/internal/trust"
)

var keyCmd = &cobra.Command{
	Use:   "key",
	Short: "Make and inspect the Ed25519 keys that sign snapshots",
	Long: `Snapshots can be signed so that nodes restore only what a publisher they
trust published. A publisher signs with a private key ([trust] signing_key):
every snapshot it publishes, and any it signs later (warmstart snapshot
sign). A node that lists public keys in [trust] trusted_keys restores a
snapshot only if its record carries a signature by one of them over the
record as it is; without trusted keys it checks no signature.

Keys are files: the private key PEM "PRIVATE KEY" (PKCS #8, Ed25519), mode
0600, owned by the user that uses it or root; the public key PEM "PUBLIC
KEY" (PKIX), writable by no one else. OpenSSL reads and writes both
(openssl genpkey -algorithm ed25519; openssl pkey -pubout). A key is named
by its id: the first 8 bytes of the SHA-256 of its 32 raw bytes, in hex.

Rotating a key:
  1. warmstart key generate --out NEW
  2. add NEW.pub to [trust] trusted_keys on every node, next to the old key
  3. set [trust] signing_key = NEW.key on the publishers
  4. warmstart snapshot sign --all on a publisher: every snapshot gains a
     signature by NEW (old signatures stay valid)
  5. remove the old key from [trust] trusted_keys on every node
A node refuses every snapshot signed only by a key it no longer lists.`,
}

var keyGenerateOut string

var keyGenerateCmd = &cobra.Command{
	Use:   "generate --out PREFIX",
	Short: "Make a key pair: PREFIX.key (private, 0600) and PREFIX.pub",
	Long: `Make a fresh Ed25519 key pair and write PREFIX.key (the private key, PEM
PKCS #8, mode 0600) and PREFIX.pub (the public key, PEM PKIX, mode 0644),
each durably. Nothing is overwritten: if either file exists the command
fails before writing anything. It prints the key's id.`,
	Args: cli.Args(cobra.NoArgs),
	RunE: func(cmd *cobra.Command, _ []string) error {
		if keyGenerateOut == "" {
			return usageError{Err: errors.New("key generate: --out PREFIX is required")}
		}
		if err := trust.CheckPrefix(keyGenerateOut); err != nil {
			return usageError{Err: fmt.Errorf("key generate: --out %w", err)}
		}
		k, err := trust.GenerateFiles(keyGenerateOut)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\twrote %s%s and %s%s\n", k.ID(),
			keyGenerateOut, trust.PrivateSuffix, keyGenerateOut, trust.PublicSuffix)
		return err
	},
}

var keyShowJSON bool

var keyShowCmd = &cobra.Command{
	Use:   "show FILE [--json]",
	Short: "Print a key file's id and public key",
	Long: `Print the id and the public key (PEM PKIX, what a PREFIX.pub holds) of a key
file, public or private; a private key's file must pass the same checks as
[trust] signing_key (owned by this user or root, mode 0600), a public
key's those of [trust] trusted_keys (writable by no one else). With --json,
{"id", "algorithm", "private", "public_key"}.`,
	Args: cli.Args(cobra.ExactArgs(1)),
	RunE: func(cmd *cobra.Command, args []string) error {
		k, err := trust.LoadPublic(args[0])
		if err != nil {
			return fmt.Errorf("key show: %w", err)
		}
		return report.Key(cmd.OutOrStdout(), report.KeyInfo{ID: k.ID(), Algorithm: repository.SignatureAlgorithm,
			Private: k.Private != nil, PublicKey: string(trust.EncodePublic(k.Public))}, keyShowJSON)
	},
}

func init() {
	keyGenerateCmd.Flags().StringVar(&keyGenerateOut, "out", "", "write PREFIX.key and PREFIX.pub")
	keyShowCmd.Flags().BoolVar(&keyShowJSON, "json", false, "print JSON")
	keyCmd.AddCommand(keyGenerateCmd, keyShowCmd)
	rootCmd.AddCommand(keyCmd)
}
