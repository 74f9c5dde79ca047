package posixfs

// Fault points name the steps of publish, the attaches and delete at
// which the crash tests stop a real process with SIGKILL, to check that a
// crash anywhere leaves nothing half visible. Only those tests arm them:
// the hook that kills the process, and the environment variable that arms
// it in a test's child process, exist in this package's test files alone
// (faultpoint_test.go). In any other build r.fault is a nil check.

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
	FaultRefineAfterFileTemp      = "attach-refinement.after-file-temp"
	FaultRefineAfterFile          = "attach-refinement.after-file"
	FaultRefineAfterRecordTemp    = "attach-refinement.after-record-temp"
	FaultRefineAfterRecord        = "attach-refinement.after-record"
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
	FaultRefineAfterFileTemp, FaultRefineAfterFile, FaultRefineAfterRecordTemp, FaultRefineAfterRecord,
	FaultDeleteAfterRecord, FaultDeleteAfterAlias, FaultDeleteAfterArtifactsGone,
}

// fault fires the fault point named point if a test armed a hook.
func (r *Repo) fault(point string) {
	if point != "" && r.faultHook != nil {
		r.faultHook(point)
	}
}

// Fault points a layer publish adds; it also passes
// FaultPublishAfterVMStateTemp, FaultPublishAfterRecordTemp and
// FaultPublishAfterRecord.
const (
	FaultLayerAfterMarkers   = "layer.after-markers"
	FaultLayerAfterDataTemp  = "layer.after-data-temp"
	FaultLayerAfterArtifacts = "layer.after-artifacts"
)

// LayerFaultPoints lists every fault point of a layer publish, in order.
var LayerFaultPoints = []string{
	FaultLayerAfterMarkers, FaultPublishAfterVMStateTemp, FaultLayerAfterDataTemp, FaultLayerAfterArtifacts,
	FaultPublishAfterRecordTemp, FaultPublishAfterRecord,
}
