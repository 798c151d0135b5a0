package main

import (
	"strings"
	"testing"
)

func TestKeyFormatUsageErrors(t *testing.T) {
	redis := []string{"-backend", "redis", "-redis-url", "redis://h:1"}
	for _, c := range []struct {
		env  env
		args []string
		want string
	}{
		{nil, append(redis, "-redis-key-format", "envoy"), `invalid -redis-key-format "envoy"; accepted: native, reference`},
		{env{"RATELIMITD_REDIS_KEY_FORMAT": "lyft"}, redis, `invalid RATELIMITD_REDIS_KEY_FORMAT "lyft"; accepted: native, reference`},
		{nil, append(redis, "-redis-expiration-jitter", "-1s"), `invalid -redis-expiration-jitter -1s; it must be whole seconds, not negative`},
		{nil, append(redis, "-redis-expiration-jitter", "1500ms"), `invalid -redis-expiration-jitter 1.5s; it must be whole seconds`},
	} {
		code, _, errOut := runMain(t, c.env, c.args...)
		if code != exitUsage || !strings.Contains(errOut, c.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want exit 2 and %q", c.env, c.args, code, errOut, c.want)
		}
	}
}

func TestKeyFormatFlags(t *testing.T) {
	code, out, _ := runMain(t, nil, "help")
	for _, want := range []string{"-redis-key-format", "-redis-expiration-jitter"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("help lacks %s", want)
		}
	}
	for _, c := range []struct {
		backend, format string
		want            bool
	}{
		{"redis", "reference", true},
		{"redis", "native", false},
		{"memory", "reference", false}, // no reference pod shares a process's memory
	} {
		b := &backendStore{backend: c.backend, redis: redisConfig{keyFormat: c.format}}
		if got := b.referenceKeys(); got != c.want {
			t.Errorf("%s, %s: reference keys %v, want %v", c.backend, c.format, got, c.want)
		}
	}
}
