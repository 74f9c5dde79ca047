package node_test

import (
	"testing"

	"warmstart/internal/config"
	"warmstart/internal/node"
	"warmstart/internal/repository/s3"
)

// TestS3TakesTheConfiguredAddressingStyles: every addressing_style the
// configuration accepts is one the s3 repository opens with, passed on as
// it is, so a valid configuration never fails at the first request.
func TestS3TakesTheConfiguredAddressingStyles(t *testing.T) {
	for _, style := range config.AddressingStyles() {
		c := config.Default().Backend.S3
		c.AddressingStyle = style
		if err := s3.CheckAddressingStyle(node.S3Options(c).AddressingStyle); err != nil {
			t.Errorf("addressing_style %q: %v", style, err)
		}
	}
	if err := s3.CheckAddressingStyle("dns"); err == nil {
		t.Error("an addressing style s3 does not know was taken")
	}
}

// The startup pack streams with the configured GETs in flight.
func TestS3TakesThePackConcurrency(t *testing.T) {
	c := config.Default().Backend.S3
	c.PackConcurrency = 12
	if got := s3.PackWarmOptions(node.S3Options(c).Warm).Concurrency; got != 12 {
		t.Fatalf("pack streams with %d GETs in flight, want 12", got)
	}
}
