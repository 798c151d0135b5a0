// Package reload reloads rule files while the server runs.
//
// A [Watcher] watches the rule path given to config.Load with fsnotify and,
// after a burst of changes has settled ([Options.Debounce]), loads the whole
// path again with config.Load:
//
//   - The whole set is validated together, exactly as at startup. When it
//     is valid and its hash differs from the rules in force, it is handed to
//     [Options.Apply], whose job is the swap (typically service.SetRules, an
//     atomic pointer store: a request is decided entirely under the old
//     rules or entirely under the new ones, never a mix).
//   - When anything is wrong, the set is rejected whole: nothing of it is
//     applied, [Options.Reject] gets the error (one line per problem, each
//     naming file, line and field), it is logged and counted, and the last
//     good rules keep serving. A later change that fixes the files is
//     applied as usual.
//   - A set with the same hash as the rules in force (a file saved
//     unchanged, a touch, a chmod) is not applied again, nor parsed: its
//     files are read and hashed first ([config.HashOf]), which takes
//     milliseconds where parsing a domain of 100,000 descriptors takes
//     seconds.
//
// Deleting one rule file of a directory is a valid change: its domain goes
// away. Deleting every rule file, or the rule file named by a file path,
// makes config.Load fail ("no rule files", "no such file"), which is
// rejected like any invalid set: the server keeps serving the last good
// rules.
//
// The watcher watches a directory, never a file: the directory itself when
// the path is one, else the file's parent directory, because editors and
// Kubernetes replace files by renaming new ones over them, which a watch
// on the old file's inode would not see. For a file path, only events
// naming that file, or a name starting with "..", lead to a reload; for a
// directory, names config.Load would read (*.yaml, *.yml not starting with
// ".") and names starting with "..". With [Options.Config] Reference (the
// reference's reading, subdirectories included), every directory below the
// path is watched too and every name not starting with "." counts.
//
// # Kubernetes ConfigMaps
//
// A ConfigMap mounted as a volume is a directory such as
//
//	..2026_11_22_10_00_00.123456789/rules.yaml
//	..data -> ..2026_11_22_10_00_00.123456789
//	rules.yaml -> ..data/rules.yaml
//
// The kubelet updates it atomically: it writes a new timestamped directory,
// points a new symbolic link ..data_tmp at it, renames ..data_tmp over
// ..data and removes the old directory. No event ever names rules.yaml,
// which is why events on names starting with ".." count as changes.
// config.Load follows the symbolic links and skips names starting with ".",
// so it reads rules.yaml through ..data once, never the timestamped
// directories. When a key leaves the ConfigMap, its link dangles for a
// moment before the kubelet removes it; a load in that moment fails and is
// rejected, and the removal that follows triggers the load that succeeds.
//
// # Swapped runtime roots
//
// envoyproxy/ratelimit's runtime convention deploys rules as snapshots
// under a root that is a symbolic link, RUNTIME_ROOT=/srv/runtime_data/current
// pointing at the latest snapshot, swapped by renaming a new link over it.
// A watch on the rule directory follows the old snapshot's directory, so
// the watcher also watches the directory of every symbolic link on the
// path; an event naming such a link moves the watch to the new target and
// loads it. Edits inside the snapshot in force load as usual.
//
// # Failures of the watch itself
//
// When the watched directory is removed or renamed away, the watcher logs
// it once, keeps the rules in force and tries to watch the path again once a
// second; when the directory is back, it loads it. An fsnotify queue
// overflow, which may have dropped events, triggers a load too.
package reload
