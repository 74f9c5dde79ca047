package s3

import (
	"strings"
	"testing"
)

// TestBareEndpointOfAnHTTPStoreSaysToWriteHTTP: an endpoint without a
// scheme means HTTPS (as AWS S3 and docs/configuration.md have it); a
// store that answers plain HTTP there is refused by Open with an error
// that says to write http://, not only the TLS client's complaint.
func TestBareEndpointOfAnHTTPStoreSaysToWriteHTTP(t *testing.T) {
	needServer(t)
	o := testOptions(t, server.Endpoint)
	o.Endpoint = server.Endpoint
	r, err := Open(bg(), o)
	if err == nil {
		r.Close()
		t.Fatalf("Open of the HTTP store at the bare endpoint %s succeeded; want it refused", server.Endpoint)
	}
	if !strings.Contains(err.Error(), "write http://"+server.Endpoint) {
		t.Fatalf("Open of the HTTP store at the bare endpoint %s = %v; want it to say to write http://%s",
			server.Endpoint, err, server.Endpoint)
	}
	// store init creates the bucket before any Open: the same advice.
	if _, err := CreateBucket(bg(), o); err == nil || !strings.Contains(err.Error(), "write http://"+server.Endpoint) {
		t.Fatalf("CreateBucket at the bare endpoint %s = %v; want it to say to write http://%s", server.Endpoint, err, server.Endpoint)
	}
}
