package report

import (
	"fmt"
	"io"
	"strings"
	"time"

	"warmstart/internal/capture"
	"warmstart/internal/recorder"
	"warmstart/internal/vmm"
)

// Capture prints what `capture` made, as JSON or for people (kind is the
// VMM that booted the guest): the snapshot, and its startup manifest or
// why it was not recorded (rec is nil when no recording was asked for).
func Capture(w io.Writer, kind string, out capture.Snapshot, rec *recorder.Result, recErr error, asJSON bool) error {
	if asJSON {
		return captureJSON(w, out, rec, recErr)
	}
	captureText(w, kind, out, rec, recErr)
	return nil
}

// captureJSON prints `capture --json`: the snapshot, and the startup
// manifest or why it was not recorded.
func captureJSON(w io.Writer, out capture.Snapshot, rec *recorder.Result, recErr error) error {
	doc := map[string]any{
		"id": out.Record.ID, "alias": out.Record.Alias, "accel": out.Accel, "token": out.Token,
		"boot_ns": out.Boot, "capture_ns": out.Capture, "record": out.Record, "ready": out.Ready.Detail,
	}
	if rec != nil {
		doc["manifest"] = rec
	}
	if recErr != nil {
		doc["manifest_error"] = recErr.Error()
	}
	return JSON(w, doc)
}

// captureText prints a capture for people.
func captureText(w io.Writer, kind string, out capture.Snapshot, rec *recorder.Result, recErr error) {
	fmt.Fprintln(w, out.Record.ID)
	fmt.Fprintf(w, "  alias               %s\n", OrDash(out.Record.Alias))
	if kind == vmm.DriverQEMU {
		fmt.Fprintf(w, "  accelerator         %s (restore with the same [qemu] accel, memory_mib and vcpus)\n", out.Accel)
		fmt.Fprintf(w, "  agent token         %s\n", out.Token)
	} else {
		fmt.Fprintf(w, "  agent answered      %q\n", strings.TrimSpace(out.Ready.Detail.AgentAnswer))
	}
	fmt.Fprintf(w, "  boot to agent       %v\n", out.Boot.Round(time.Millisecond))
	fmt.Fprintf(w, "  capture             %v\n", out.Capture.Round(time.Millisecond))
	fmt.Fprintf(w, "  memory              %d bytes, sha256 %s\n", out.Record.MemorySize, out.Record.MemorySHA256)
	switch {
	case rec == nil:
		fmt.Fprintln(w, "  startup manifest    not recorded ([manifest] record_after_publish is off)")
	case recErr == nil:
		fmt.Fprintf(w, "  startup manifest    attached: sha256 %s, %d ranges, %.1f MiB from %d touches, recorder ready after %v\n",
			rec.Descriptor.SHA256, rec.Ranges, float64(rec.Bytes)/(1<<20), rec.Touches, rec.ReadyAfter.Round(time.Millisecond))
		fmt.Fprintf(w, "  recorded from       %s\n", RecordingLine(rec.Recording, rec.Fallback))
	}
}
