// Package config loads rule files and matches request descriptors to rules.
//
// Rule files use the YAML format of envoyproxy/ratelimit (the "Lyft"
// format): one domain per file and a tree of descriptors, each with a key,
// an optional value (exact, or a wildcard holding "*") and an optional
// rate_limit. Every field of that format is accepted, so its rule files load
// unchanged, plus ratelimitd's extensions: rate_limit.algorithm,
// rate_limit.burst, a descriptor's rate_limits (several limits decided
// together, each a rate_limit block without replaces and unlimited; see
// [Rule.Limits]) and a file-level failure_mode. Limits are validated
// against the bounds within which package algo computes exactly
// ([MaxLog], [MaxBucket], [MaxRefill]), so every rule that loads is one the
// algorithms decide.
//
// Validation is strict and complete: [Load] and [Parse] report every problem
// at once, each as an [*Error] naming the file, line, column and field and
// saying what would be accepted, and return no rules at all when anything is
// wrong. Loaded [Rules] are immutable; [Domain.Match] finds the rule for a
// descriptor without allocating.
//
// [Options] choose between two readings of a rule directory and its files:
// native (the zero value), and envoyproxy/ratelimit's for compatibility
// mode (Options.Reference: subdirectories and files of any name, only a
// file's first document, the last of a field given twice). Either way, a
// rule-looking file left unread and a field accepted but not used are in
// [Rules.Warnings], each naming its file and line.
//
// Of ratelimitd, the package imports only package algo, for the
// algorithms a rule file may name ([algo.Algorithms]) and what each takes
// (burst, leasing): their names and properties, not how they work.
package config
