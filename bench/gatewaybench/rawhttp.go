package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// rawClient is one keep-alive HTTP/1.1 connection that writes each request as one buffer and reads the
// answer's status and body, as wrk and pgbench's own client do: no header maps, no pool, no goroutine per
// connection. The load generator shares the machine's two cores with the gateway and Postgres, and
// net/http's client spent about 95 µs of CPU a request there, a quarter of the cores at 2,400 requests a
// second, that pgbench, the yardstick, does not take from its server. Every answer's status is still
// checked by the caller, and the body read to its end.
type rawClient struct {
	addr string
	conn net.Conn
	br   *bufio.Reader
	req  []byte
}

func newRawClient(base string) *rawClient {
	return &rawClient{addr: strings.TrimPrefix(base, "http://")}
}

// post sends a POST with the headers the gateway's API takes, and returns the answer's status.
func (c *rawClient) post(path, key, contentType, body string) (int, error) {
	c.req = append(c.req[:0], "POST "...)
	c.req = append(c.req, path...)
	c.req = append(c.req, " HTTP/1.1\r\nHost: "...)
	c.req = append(c.req, c.addr...)
	c.req = append(c.req, "\r\nAuthorization: Bearer "+apiKey+"\r\nContent-Type: "...)
	c.req = append(c.req, contentType...)
	c.req = append(c.req, "\r\nIdempotency-Key: "...)
	c.req = append(c.req, key...)
	c.req = append(c.req, "\r\nContent-Length: "...)
	c.req = strconv.AppendInt(c.req, int64(len(body)), 10)
	c.req = append(c.req, "\r\n\r\n"...)
	c.req = append(c.req, body...)
	for try := 0; ; try++ {
		status, err := c.roundTrip()
		if err == nil || try == 1 {
			return status, err
		}
		// A keep-alive connection the server closed while idle: once more on a new one, as net/http does.
		c.close()
	}
}

func (c *rawClient) roundTrip() (int, error) {
	if c.conn == nil {
		conn, err := net.Dial("tcp", c.addr)
		if err != nil {
			return 0, err
		}
		c.conn, c.br = conn, bufio.NewReaderSize(conn, 16<<10)
	}
	if _, err := c.conn.Write(c.req); err != nil {
		return 0, err
	}
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, fmt.Errorf("not an HTTP/1.1 status line: %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("status line %q: %w", line, err)
	}
	length, chunked, closing := -1, false, false
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		h := bytes.TrimRight(line, "\r\n")
		if len(h) == 0 {
			break
		}
		name, value, _ := bytes.Cut(h, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil {
				return 0, fmt.Errorf("Content-Length %q: %w", value, err)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case chunked:
		if err := c.discardChunks(); err != nil {
			return 0, err
		}
	case length >= 0:
		if _, err := c.br.Discard(length); err != nil {
			return 0, err
		}
	default:
		_, _ = io.Copy(io.Discard, c.br) // the body ends with the connection
		closing = true
	}
	if closing {
		c.close()
	}
	return status, nil
}

func (c *rawClient) discardChunks() error {
	for {
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		size, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
		n, err := strconv.ParseInt(string(size), 16, 64)
		if err != nil {
			return fmt.Errorf("chunk size %q: %w", size, err)
		}
		if n == 0 {
			for { // trailers, up to the empty line
				line, err := c.br.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(bytes.TrimRight(line, "\r\n")) == 0 {
					return nil
				}
			}
		}
		if _, err := c.br.Discard(int(n) + 2); err != nil {
			return err
		}
	}
}

func (c *rawClient) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn, c.br = nil, nil
	}
}
