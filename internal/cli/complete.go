package cli

import (
	"context"
	"strings"

	"github.com/spf13/cobra"

	"warmstart/internal/config"
	"warmstart/internal/repository"
)

// Shell completion beyond verbs and flag names: the snapshots a verb that
// takes ID|ALIAS can name, and the values of the enumerated flags.

// enumFlags are the flags whose values completion offers, by name.
var enumFlags = map[string][]string{
	"vmm":      config.Drivers(),
	"device":   config.Devices(),
	"prefetch": {"auto", "on", "off"},
	"policy":   config.Policies(),
}

// RegisterCompletions walks the verbs below root: a verb whose usage
// takes ID|ALIAS completes its argument with the aliases and ids of the
// configured repository, and the enumerated flags complete their values.
func (e *Env) RegisterCompletions(root *cobra.Command) {
	for _, c := range root.Commands() {
		if strings.Contains(c.Use, "ID|ALIAS") && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = e.completeSnapshots
		}
		for name, values := range enumFlags {
			if c.Flags().Lookup(name) != nil {
				_ = c.RegisterFlagCompletionFunc(name, cobra.FixedCompletions(values, cobra.ShellCompDirectiveNoFileComp))
			}
		}
		e.RegisterCompletions(c)
	}
}

// completeSnapshots offers the aliases (each with its id as the
// description) and the ids of the repository the configuration names,
// read-only; nothing when it cannot be opened.
func (e *Env) completeSnapshots(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	if cmd.Context() == nil {
		cmd.SetContext(context.Background())
	}
	repo, err := e.OpenReadOnlyRepository(cmd)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	recs, err := repo.List(cmd.Context(), repository.Filter{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, r := range recs {
		if r.Alias != "" && strings.HasPrefix(r.Alias, toComplete) {
			out = append(out, r.Alias+"\t"+r.ID)
		}
		if strings.HasPrefix(r.ID, toComplete) {
			out = append(out, r.ID)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
