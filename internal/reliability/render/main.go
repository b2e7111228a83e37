// Command render makes docs/reliability.md from the rows reliability.Record wrote and the output of the
// `go test -json` runs that wrote them: each row's status is go test's verdict on its test.
package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/oncegate/oncegate/internal/reliability"
)

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: render ROWS.jsonl OUT.md GO-TEST-JSON...")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], os.Args[3:]); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(rowsFile, out string, jsonFiles []string) error {
	b, err := os.ReadFile(rowsFile)
	if err != nil {
		return err
	}
	rows, err := reliability.ReadRows(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("%s: %w", rowsFile, err)
	}
	verdicts := map[reliability.Test]string{}
	for _, f := range jsonFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		v, err := reliability.Verdicts(bytes.NewReader(b))
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for k, s := range v {
			if verdicts[k] != "FAIL" {
				verdicts[k] = s
			}
		}
	}
	for k, s := range verdicts {
		if k.Name == "" && s == "FAIL" {
			fmt.Fprintf(os.Stderr, "go test: FAIL %s\n", k.Package)
		}
	}
	doc, failing := reliability.Render(rows, verdicts)
	if err := os.WriteFile(out, []byte(doc), 0o644); err != nil {
		return err
	}
	for _, r := range failing {
		fmt.Fprintf(os.Stderr, "%s: %s %s (%s)\n", r.Status, r.Package, r.Test, r.Fault)
	}
	if len(failing) > 0 {
		return fmt.Errorf("%d of %d rows not passing", len(failing), len(rows))
	}
	return nil
}
