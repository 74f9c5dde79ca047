package miniotest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy is a Toxiproxy TCP proxy, run in this process, between a client and
// an upstream address. Toxics apply to each connection on its own: a
// bandwidth limit is per connection, as an object store's per-connection
// throughput is.
type Proxy struct {
	// Addr is host:port clients connect to.
	Addr  string
	proxy *toxiproxy.Proxy
}

// NewProxy starts a proxy on a free port of 127.0.0.1 forwarding to
// upstream. Close it when done.
func NewProxy(upstream string) (*Proxy, error) {
	// Toxics log through zerolog's global logger; nothing here wants it.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "minio", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("toxiproxy to %s: %w", upstream, err)
	}
	return &Proxy{Addr: p.Listen, proxy: p}, nil
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() { p.proxy.Stop() }

// Latency delays each chunk of data flowing from the server to the client
// by ms milliseconds: every response arrives that much later.
func (p *Proxy) Latency(ms int) error {
	return p.add("latency", "downstream", map[string]any{"latency": ms})
}

// Bandwidth limits each connection's server-to-client stream to
// bitsPerSecond.
func (p *Proxy) Bandwidth(bitsPerSecond int64) error {
	// Toxiproxy's rate is in KB/s (1000 bytes).
	return p.add("bandwidth", "downstream", map[string]any{"rate": bitsPerSecond / 8 / 1000})
}

// ResetAfter resets connections (TCP RST) ms milliseconds after the server
// first answers, dropping the answer: each new connection with probability
// fraction.
func (p *Proxy) ResetAfter(ms int, fraction float64) error {
	return p.addWith("reset_peer", "downstream", fraction, map[string]any{"timeout": ms})
}

// CutAfter closes each connection once n bytes have flowed from the server
// to the client: a response body longer than that arrives truncated.
func (p *Proxy) CutAfter(n int64) error {
	return p.add("limit_data", "downstream", map[string]any{"bytes": n})
}

// Remove removes a toxic added by Latency ("latency"), Bandwidth
// ("bandwidth"), ResetAfter ("reset_peer") or CutAfter ("limit_data").
func (p *Proxy) Remove(kind string) error {
	return p.proxy.Toxics.RemoveToxic(context.Background(), kind)
}

func (p *Proxy) add(kind, stream string, attrs map[string]any) error {
	return p.addWith(kind, stream, 1, attrs)
}

func (p *Proxy) addWith(kind, stream string, toxicity float64, attrs map[string]any) error {
	body, err := json.Marshal(map[string]any{
		"name": kind, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attrs,
	})
	if err != nil {
		return err
	}
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(string(body))); err != nil {
		return fmt.Errorf("toxiproxy: add %s: %w", kind, err)
	}
	return nil
}
