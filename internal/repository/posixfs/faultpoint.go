package posixfs

import (
	"os"
	"syscall"
)

// FaultPointEnv names the environment variable that arms a fault point: when
// it holds the name of one (for example "publish.after-record-temp"), the
// process kills itself with SIGKILL on reaching that point. Crash tests use
// it to stop a real process at every step of publish, the attaches and delete;
// unset, fault points cost one string comparison. FaultPoints lists them.
const FaultPointEnv = "WARMSTART_FAULTPOINT"

// Fault points, in the order each operation reaches them.
const (
	FaultPublishAfterDir          = "publish.after-dir"
	FaultPublishAfterVMStateTemp  = "publish.after-vmstate-temp"
	FaultPublishAfterMemoryTemp   = "publish.after-memory-temp"
	FaultPublishAfterArtifacts    = "publish.after-artifacts"
	FaultPublishAfterAliasTemp    = "publish.after-alias-temp"
	FaultPublishAfterAlias        = "publish.after-alias"
	FaultPublishAfterRecordTemp   = "publish.after-record-temp"
	FaultPublishAfterRecord       = "publish.after-record"
	FaultAttachAfterClear         = "attach.after-clear-descriptor"
	FaultAttachAfterManifestTemp  = "attach.after-manifest-temp"
	FaultAttachAfterManifest      = "attach.after-manifest"
	FaultAttachAfterRecordTemp    = "attach.after-record-temp"
	FaultAttachAfterRecord        = "attach.after-record"
	FaultDigestsAfterClear        = "attach-digests.after-clear-descriptor"
	FaultDigestsAfterTableTemp    = "attach-digests.after-table-temp"
	FaultDigestsAfterTable        = "attach-digests.after-table"
	FaultDigestsAfterRecordTemp   = "attach-digests.after-record-temp"
	FaultDigestsAfterRecord       = "attach-digests.after-record"
	FaultDeleteAfterRecord        = "delete.after-record"
	FaultDeleteAfterAlias         = "delete.after-alias"
	FaultDeleteAfterArtifactsGone = "delete.after-artifacts"
)

// FaultPoints lists every fault point.
var FaultPoints = []string{
	FaultPublishAfterDir, FaultPublishAfterVMStateTemp, FaultPublishAfterMemoryTemp,
	FaultPublishAfterArtifacts, FaultPublishAfterAliasTemp, FaultPublishAfterAlias,
	FaultPublishAfterRecordTemp, FaultPublishAfterRecord,
	FaultAttachAfterClear, FaultAttachAfterManifestTemp, FaultAttachAfterManifest,
	FaultAttachAfterRecordTemp, FaultAttachAfterRecord,
	FaultDigestsAfterClear, FaultDigestsAfterTableTemp, FaultDigestsAfterTable,
	FaultDigestsAfterRecordTemp, FaultDigestsAfterRecord,
	FaultDeleteAfterRecord, FaultDeleteAfterAlias, FaultDeleteAfterArtifactsGone,
}

// faultHookFromEnv returns the hook armed by FaultPointEnv, or nil.
func faultHookFromEnv() func(string) {
	armed := os.Getenv(FaultPointEnv)
	if armed == "" {
		return nil
	}
	return func(point string) {
		if point == armed {
			// SIGKILL cannot be caught: the process dies here with its
			// descriptors (and so its flocks) closed by the kernel, as in a
			// real crash of the holder.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never reached; the signal is delivered first
		}
	}
}

// fault fires the fault point named point if a hook is armed.
func (r *Repo) fault(point string) {
	if point != "" && r.faultHook != nil {
		r.faultHook(point)
	}
}
