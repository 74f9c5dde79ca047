package snapcheck

import (
	"errors"
	"os"

	"warmstart/internal/manifest"
	"warmstart/internal/refine"
	"warmstart/internal/repository"
	"warmstart/internal/untrusted"
)

// refinement reads the learned manifest file whole, when the record has
// one, and checks it as its users do: size and SHA-256 against the
// record, the refined manifest as a restore validates it, and the state
// as the learner decodes it.
func (c *checker) refinement() {
	d := c.res.Record.Refinement
	if d == nil {
		return
	}
	a := c.r.artifact(repository.RefinementFileName(d.SHA256))
	a.Status = StatusOK
	mdata, state, err := repository.ReadRefinement(c.res.RefinementPath, *d)
	switch {
	case errors.Is(err, os.ErrNotExist) || c.res.RefinementPath == "":
		a.problem(KindMissing, "the refinement file is not there")
		return
	case errors.Is(err, untrusted.ErrNotRegular):
		a.problem(KindNotRegular, "%v", err)
		return
	case errors.Is(err, repository.ErrRefinementCorrupt):
		a.problem(KindSHA256, "%v", err)
		return
	case err != nil:
		openProblem(a, err)
		return
	}
	a.ReadBytes, a.ReadSHA256 = d.Size, d.SHA256
	if _, err := manifest.Verify(mdata, manifest.Descriptor{SHA256: d.ManifestSHA256, Size: d.ManifestSize}, c.res.Record.Layout); err != nil {
		a.problem(KindInvalid, "refined manifest: %v", err)
	}
	if _, err := refine.Decode(state); err != nil {
		a.problem(KindInvalid, "%v", err)
	}
}
