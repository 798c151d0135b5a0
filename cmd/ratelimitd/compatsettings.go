package main

import "strings"

// referenceSettings is every environment variable envoyproxy/ratelimit
// reads: the envconfig names of its Settings (src/settings/settings.go at
// f2fb15770f7fd1c88ca6c3a1b58ee513917ace96), in its order, as recorded in
// testdata/reference-settings.txt (TestReferenceSettingsFixture holds it
// to the recording). docs/migrating.md marks each honoured, mapped,
// ignored or refused. Read only.
var referenceSettings = []string{
	"HOST",
	"PORT",
	"DEBUG_HOST",
	"DEBUG_PORT",
	"GRPC_UDS",
	"GRPC_HOST",
	"GRPC_PORT",
	"GRPC_MAX_CONNECTION_AGE",
	"GRPC_MAX_CONNECTION_AGE_GRACE",
	"GRPC_SERVER_USE_TLS",
	"GRPC_SERVER_TLS_CERT",
	"GRPC_SERVER_TLS_KEY",
	"GRPC_CLIENT_TLS_CACERT",
	"GRPC_CLIENT_TLS_SAN",
	"LOG_LEVEL",
	"LOG_FORMAT",
	"CONFIG_TYPE",
	"FORCE_START_WITHOUT_INITIAL_CONFIG",
	"CONFIG_GRPC_XDS_NODE_ID",
	"CONFIG_GRPC_XDS_NODE_METADATA",
	"CONFIG_GRPC_XDS_SERVER_URL",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
	"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS",
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
	"CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
	"CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
	"XDS_CLIENT_BACKOFF_MAX_INTERVAL",
	"XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
	"XDS_CLIENT_BACKOFF_JITTER",
	"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
	"USE_DOG_STATSD",
	"USE_DOG_STATSD_MOGRIFIERS",
	"USE_STATSD",
	"STATSD_HOST",
	"STATSD_PORT",
	"EXTRA_TAGS",
	"STATS_FLUSH_INTERVAL",
	"DISABLE_STATS",
	"USE_PROMETHEUS",
	"PROMETHEUS_ADDR",
	"PROMETHEUS_PATH",
	"PROMETHEUS_MAPPER_YAML",
	"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
	"RUNTIME_ROOT",
	"RUNTIME_SUBDIRECTORY",
	"RUNTIME_APPDIRECTORY",
	"RUNTIME_IGNOREDOTFILES",
	"RUNTIME_WATCH_ROOT",
	"EXPIRATION_JITTER_MAX_SECONDS",
	"LOCAL_CACHE_SIZE_IN_BYTES",
	"NEAR_LIMIT_RATIO",
	"CACHE_KEY_PREFIX",
	"BACKEND_TYPE",
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
	"LIMIT_RESPONSE_HEADERS_ENABLED",
	"LIMIT_LIMIT_HEADER",
	"LIMIT_REMAINING_HEADER",
	"LIMIT_RESET_HEADER",
	"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
	"REDIS_SOCKET_TYPE",
	"REDIS_TYPE",
	"REDIS_URL",
	"REDIS_POOL_SIZE",
	"REDIS_AUTH",
	"REDIS_TLS",
	"REDIS_TLS_CLIENT_CERT",
	"REDIS_TLS_CLIENT_KEY",
	"REDIS_TLS_CACERT",
	"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
	"REDIS_PIPELINE_WINDOW",
	"REDIS_PIPELINE_LIMIT",
	"REDIS_CLUSTER_PIPELINE_PARALLELISM",
	"REDIS_PERSECOND",
	"REDIS_PERSECOND_SOCKET_TYPE",
	"REDIS_PERSECOND_TYPE",
	"REDIS_PERSECOND_URL",
	"REDIS_PERSECOND_POOL_SIZE",
	"REDIS_PERSECOND_AUTH",
	"REDIS_PERSECOND_TLS",
	"REDIS_SENTINEL_AUTH",
	"REDIS_PERSECOND_SENTINEL_AUTH",
	"REDIS_PERSECOND_PIPELINE_WINDOW",
	"REDIS_PERSECOND_PIPELINE_LIMIT",
	"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
	"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
	"REDIS_TIMEOUT",
	"REDIS_PERSECOND_TIMEOUT",
	"REDIS_POOL_ON_EMPTY_BEHAVIOR",
	"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
	"REDIS_STARTUP_INITIAL_INTERVAL",
	"REDIS_STARTUP_MAX_INTERVAL",
	"REDIS_STARTUP_MAX_ELAPSED_TIME",
	"MEMCACHE_HOST_PORT",
	"MEMCACHE_MAX_IDLE_CONNS",
	"MEMCACHE_SRV",
	"MEMCACHE_SRV_REFRESH",
	"MEMCACHE_TLS",
	"MEMCACHE_TLS_CLIENT_CERT",
	"MEMCACHE_TLS_CLIENT_KEY",
	"MEMCACHE_TLS_CACERT",
	"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
	"SHADOW_MODE",
	"QUOTA_MODE",
	"RESPONSE_DYNAMIC_METADATA",
	"MERGE_DOMAIN_CONFIG",
	"TRACING_ENABLED",
	"TRACING_SERVICE_NAME",
	"TRACING_SERVICE_NAMESPACE",
	"TRACING_SERVICE_INSTANCE_ID",
	"TRACING_EXPORTER_PROTOCOL",
	"TRACING_SAMPLING_RATE",
}

// unreadSettings returns, with why, the reference settings set in the
// environment that compatibility mode neither read (read names them) nor
// lists among ignoredSettings: set for a reference that would not read
// them either with the other settings given (REDIS_PERSECOND_URL without
// REDIS_PERSECOND, say), or for its memcached backend. Each is logged at
// start, so that no setting is dropped in silence. xds says the rules come
// over xDS.
func unreadSettings(lookupEnv func(string) (string, bool), read map[string]bool, xds bool) []string {
	var unread []string
	for _, name := range referenceSettings {
		v, set := lookupEnv(name)
		if !set || v == "" || read[name] || ignoredSettings[name] != "" {
			continue
		}
		why := "not read with the other settings given, as the reference does not read it either"
		switch {
		case strings.HasPrefix(name, "MEMCACHE_"):
			why = "a setting of the reference's memcached backend; ratelimitd keeps counters in Redis"
		case xds && strings.HasPrefix(name, "RUNTIME_"):
			why = "the rules come over xDS (CONFIG_TYPE=GRPC_XDS_SOTW), and the rule files are not read, as in the reference"
		}
		unread = append(unread, name+" ("+why+")")
	}
	return unread
}
