package tlstest

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// stallGuard bounds each exchange of the stall helpers so that a hang
// fails; nothing asserts on time.
const stallGuard = 30 * time.Second

// PartialClientHello opens a TCP connection to addr and sends the first
// bytes of a TLS ClientHello record, then nothing: the server's handshake
// waits for the rest (net/http state new). The caller closes the
// connection.
func PartialClientHello(addr string) (net.Conn, error) {
	conn, err := net.DialTimeout("tcp", addr, stallGuard)
	if err != nil {
		return nil, err
	}
	// A handshake record of 512 bytes announced, and only the start of a
	// ClientHello (type 1, length 508, version TLS 1.2) sent.
	if _, err := conn.Write([]byte{22, 3, 1, 2, 0, 1, 0, 1, 252, 3, 3}); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// HTTP/2 framing, just enough for StalledHTTP2Request (RFC 9113, RFC 7541).
const (
	h2FrameHeaders  = 0x1
	h2FrameRST      = 0x3
	h2FrameSettings = 0x4
	h2FrameGoAway   = 0x7

	h2FlagEndStream  = 0x1
	h2FlagAck        = 0x1
	h2FlagEndHeaders = 0x4

	h2SettingInitialWindowSize = 0x4
)

func h2Frame(typ, flags byte, stream uint32, payload []byte) []byte {
	f := make([]byte, 9, 9+len(payload))
	f[0], f[1], f[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	f[3], f[4] = typ, flags
	binary.BigEndian.PutUint32(f[5:], stream)
	return append(f, payload...)
}

// hpackLiteral is a header field "literal without indexing" whose name is
// the static table entry index (below 15); value is shorter than 127 bytes.
func hpackLiteral(index byte, value string) []byte {
	return append([]byte{index, byte(len(value))}, value...)
}

// StalledHTTP2Request opens an HTTP/2 connection to addr with cfg (its
// NextProtos is set to h2), announces a flow-control window of 0 bytes and
// sends GET path. It returns once the server has sent the response headers:
// the handler ran, and the request stays in flight for as long as the
// connection is open, because the server may send none of the body. That
// is a connection a graceful shutdown waits for (net/http state active),
// and one a client that stopped reading leaves behind. The caller closes
// it.
func StalledHTTP2Request(addr string, cfg *tls.Config, path string) (net.Conn, error) {
	if len(path) >= 127 || len(cfg.ServerName) >= 127 {
		return nil, errors.New("path and server name must be shorter than 127 bytes")
	}
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: stallGuard}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
		conn.Close()
		return nil, fmt.Errorf("negotiated %q, not h2", p)
	}
	settings := make([]byte, 6)
	binary.BigEndian.PutUint16(settings, h2SettingInitialWindowSize) // value 0
	var block []byte
	block = append(block, 0x82, 0x87) // :method GET, :scheme https
	block = append(block, hpackLiteral(4, path)...)
	block = append(block, hpackLiteral(1, cfg.ServerName)...)
	var out []byte
	out = append(out, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"...)
	out = append(out, h2Frame(h2FrameSettings, 0, 0, settings)...)
	out = append(out, h2Frame(h2FrameHeaders, h2FlagEndStream|h2FlagEndHeaders, 1, block)...)
	_ = conn.SetDeadline(time.Now().Add(stallGuard))
	if _, err := conn.Write(out); err != nil {
		conn.Close()
		return nil, err
	}
	for {
		var hdr [9]byte
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			conn.Close()
			return nil, fmt.Errorf("waiting for the response headers: %w", err)
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		typ, flags, stream := hdr[3], hdr[4], binary.BigEndian.Uint32(hdr[5:])&0x7fffffff
		if _, err := io.CopyN(io.Discard, conn, int64(n)); err != nil {
			conn.Close()
			return nil, fmt.Errorf("waiting for the response headers: %w", err)
		}
		switch {
		case typ == h2FrameSettings && flags&h2FlagAck == 0:
			if _, err := conn.Write(h2Frame(h2FrameSettings, h2FlagAck, 0, nil)); err != nil {
				conn.Close()
				return nil, err
			}
		case typ == h2FrameHeaders && stream == 1:
			if flags&h2FlagEndStream != 0 {
				conn.Close()
				return nil, errors.New("the response has no body: nothing holds the stream open")
			}
			_ = conn.SetDeadline(time.Time{})
			return conn, nil
		case typ == h2FrameRST && stream == 1, typ == h2FrameGoAway:
			conn.Close()
			return nil, fmt.Errorf("the server ended the request (frame type %d)", typ)
		}
	}
}
