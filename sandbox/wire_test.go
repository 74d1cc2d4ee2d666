package sandbox

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// fill sets every exported field of v, recursively, to a distinct non-zero
// value: slices and maps get two entries, pointers a target.
func fill(v reflect.Value, seed *int) {
	*seed++
	n := *seed
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(n) + 0.5)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), seed)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), seed)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(k, seed)
			fill(e, seed)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 1, 2, 3, 4, 5, n, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), seed)
			}
		}
	}
}

// sameJSON converts a filled From and checks that the result says the same
// in JSON: every field crossed, with its value and its name.
func sameJSON[From, To any](t *testing.T, conv func(From) To) {
	t.Helper()
	var in From
	seed := 0
	fill(reflect.ValueOf(&in).Elem(), &seed)
	out := conv(in)
	a, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	var am, bm any
	json.Unmarshal(a, &am)
	json.Unmarshal(b, &bm)
	if !reflect.DeepEqual(am, bm) {
		t.Errorf("%T -> %T loses or changes fields:\n from %s\n   to %s", in, out, a, b)
	}
}

// TestWireConversionsLoseNothing: each conversion between the public API's
// types and the guest protocol's carries every field, both ways.
func TestWireConversionsLoseNothing(t *testing.T) {
	sameJSON(t, whereToGuest)
	sameJSON(t, statToGuest)
	sameJSON(t, listToGuest)
	sameJSON(t, mkdirToGuest)
	sameJSON(t, moveToGuest)
	sameJSON(t, removeToGuest)
	sameJSON(t, chmodToGuest)
	sameJSON(t, chownToGuest)
	sameJSON(t, readToGuest)
	sameJSON(t, writeToGuest)
	sameJSON(t, editToGuest)
	sameJSON(t, globToGuest)
	sameJSON(t, grepToGuest)
	sameJSON(t, uploadToGuest)
	sameJSON(t, downloadToGuest)
	sameJSON(t, fileInfoToAPI)
	sameJSON(t, existsToAPI)
	sameJSON(t, listResultToAPI)
	sameJSON(t, readResultToAPI)
	sameJSON(t, editResultToAPI)
	sameJSON(t, globResultToAPI)
	sameJSON(t, grepResultToAPI)
	sameJSON(t, uploadResultToAPI)
	sameJSON(t, downloadResultToAPI)
	sameJSON(t, archiveResultToAPI)
	sameJSON(t, watchEventToAPI)
}
