package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"warmstart/internal/cli"
	"warmstart/internal/config"
	"warmstart/internal/ops"
)

var configCmd = &cobra.Command{
	Use:   "config",
	Short: "Show the default configuration or check a configuration file",
	Long: `warmstart reads its settings from a TOML file: --config FILE, else
$WARMSTART_CONFIG, else ` + config.SystemFile + ` when it exists, else
it runs on built-in defaults. Keys a file leaves out keep their defaults.
An unknown key, a value of the wrong type or a value out of range is an
error naming the file and the key.`,
}

var configDefaultsCmd = &cobra.Command{
	Use:   "defaults",
	Short: "Print the default configuration file, every key explained",
	Long: `Print the complete default configuration: every key set to its default
value under a comment saying what it does and which values it accepts.
It is the configuration reference, and a starting point for the file
warmstart reads when neither --config nor $WARMSTART_CONFIG names one:

  warmstart config defaults > ` + config.SystemFile,
	Args: cli.Args(cobra.NoArgs),
	RunE: func(cmd *cobra.Command, _ []string) error {
		_, err := fmt.Fprint(cmd.OutOrStdout(), config.DefaultTOML())
		return err
	},
}

var configCheckCmd = &cobra.Command{
	Use:   "check [--config FILE]",
	Short: "Validate a configuration file and print ok",
	Long: `Load the configuration file (--config, else $WARMSTART_CONFIG, else
/etc/warmstart/config.toml when present, else the built-in defaults), validate
every key, read the startup trace [replay] trace names (if any) and the
[trust] key files, and print "ok". Otherwise print the first problem, naming the file
and the key, e.g.

  warmstart: config /etc/w.toml: key memory.io_engine: 3 out of range 0..2

and exit with status 1.`,
	Args: cli.Args(cobra.NoArgs),
	RunE: func(cmd *cobra.Command, _ []string) error {
		cfg, err := env.Config()
		if err != nil {
			return err
		}
		if err := ops.CheckConfig(cfg, config.Path(env.ConfigPath)); err != nil {
			return err
		}
		_, err = fmt.Fprintln(cmd.OutOrStdout(), "ok")
		return err
	},
}

func init() {
	configCmd.AddCommand(configDefaultsCmd, configCheckCmd)
	rootCmd.AddCommand(configCmd)
}
