package queue

import (
	stdjson "encoding/json"
	"reflect"
	"testing"
)

// decodeJob reads records with goccy/go-json for speed; this holds it to what encoding/json makes of the same
// bytes, on records as the scripts write them (cjson escapes "/", passes other bytes through) and on records
// no script writes, which must fail in both.
func TestRecordsDecodeAsEncodingJSONDecodesThem(t *testing.T) {
	t.Parallel()
	records := []string{
		`{"id":"0193a3b2-5c7e","kind":"email.send","state":"active","epoch":3,"runs":2,"failures":1,"stalls":1,` +
			`"max_attempts":25,"max_stalls":1,"created_at":1765080000123,"ready_at":1765080000124,` +
			`"leased_at":1765080000456,"lease_seq":1234,"owner":"w-01","last_stall":"worker lost",` +
			`"trace":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":""}}`,
		`{"id":"a\/b","last_error":"quote \" backslash \\ newline \n \u00e9 \ud83d\ude00","epoch":9007199254740993,"trace":{}}`,
		"{\"id\":\"raw bytes\",\"last_error\":\"not utf-8: \xff\xfe\",\"epoch\":1}",
		`{"id":"x","trace":null,"owner":null,"epoch":1}`,
		`{"id":"x","epoch":-1,"trace":{"a":"b"},"kind":"","unknown":{"nested":[1,2,{"k":null}]}}`,
		`{"id":"x","epoch":1.5}`,
		`{"id":"x","trace":"not an object"}`,
		`{"id":"x","trace":[]}`,
		`{"id":"x","failures":"2"}`,
		`{"id":"x"`,
	}
	for _, raw := range records {
		var want record
		wantErr := stdjson.Unmarshal([]byte(raw), &want)
		got, err := decodeJob(raw, nil)
		if (err == nil) != (wantErr == nil) {
			t.Errorf("%q: decodeJob err %v, encoding/json err %v", raw, err, wantErr)
			continue
		}
		if err == nil && !reflect.DeepEqual(got, want.job(nil)) {
			t.Errorf("%q:\n decodeJob     %+v\n encoding/json %+v", raw, got, want.job(nil))
		}
	}
}

// FuzzRecordDecoding holds decodeJob to encoding/json on any bytes: both refuse them, or both read the same job.
func FuzzRecordDecoding(f *testing.F) {
	f.Add(`{"id":"a","kind":"k","state":"active","epoch":3,"runs":1,"failures":0,"stalls":0,"max_attempts":25,` +
		`"max_stalls":1,"created_at":1765080000123,"owner":"w","trace":{"traceparent":"00-01-02-01"}}`)
	f.Add(`{"id":"a\/b","last_error":"\u00e9 \ud83d\ude00 \"q\"","epoch":1,"trace":{}}`)
	f.Add(`{"ID":"upper","Epoch":2,"id":"lower"}`)
	f.Fuzz(func(t *testing.T, raw string) {
		var want record
		wantErr := stdjson.Unmarshal([]byte(raw), &want)
		got, err := decodeJob(raw, nil)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: decodeJob err %v, encoding/json err %v", raw, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want.job(nil)) {
			t.Fatalf("%q:\n decodeJob     %+v\n encoding/json %+v", raw, got, want.job(nil))
		}
	})
}
