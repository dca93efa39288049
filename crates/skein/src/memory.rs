//! The machine's free memory, which sizes are checked against before anything is allocated.

use std::path::{Path, PathBuf};

/// Bytes in a GiB, for messages.
pub const GIB: f64 = (1u64 << 30) as f64;

/// Free memory for this process in bytes, when the system reports it: the machine's
/// (MemAvailable), or less where a control group limits the process (a container started with
/// `--memory`, a Kubernetes limit), whose own figure `/proc/meminfo` does not show.
pub fn available() -> Option<f64> {
    let machine = machine_available();
    let limited = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|groups| cgroup_headroom(Path::new("/sys/fs/cgroup"), &groups));
    match (machine, limited) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

fn machine_available() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

/// Free memory where `device` allocates, when it can be read: the machine's for the CPU;
/// none is known for an accelerator.
pub fn available_on(device: tch::Device) -> Option<f64> {
    match device {
        tch::Device::Cpu => available(),
        _ => None,
    }
}

/// The least room left under a memory limit of the process's control groups (`groups`, the
/// text of /proc/self/cgroup), its own group's and every one above it, under the cgroup
/// mount `root`: the limit less the usage, file cache that can be reclaimed aside. None where
/// no group sets a limit.
fn cgroup_headroom(root: &Path, groups: &str) -> Option<f64> {
    let mut least: Option<f64> = None;
    for line in groups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let files = match controllers {
            // cgroup v2: one hierarchy.
            "" => CgroupFiles {
                dir: root.to_path_buf(),
                limit: "memory.max",
                usage: "memory.current",
                reclaimable: "inactive_file",
            },
            c if c.split(',').any(|c| c == "memory") => CgroupFiles {
                dir: root.join("memory"),
                limit: "memory.limit_in_bytes",
                usage: "memory.usage_in_bytes",
                reclaimable: "total_inactive_file",
            },
            _ => continue,
        };
        for room in files.headrooms(path) {
            least = Some(least.map_or(room, |l: f64| l.min(room)));
        }
    }
    least
}

/// Where one cgroup version keeps a group's limit, usage and reclaimable cache.
struct CgroupFiles {
    dir: PathBuf,
    limit: &'static str,
    usage: &'static str,
    /// The `memory.stat` line of file cache the kernel reclaims before it fails an allocation.
    reclaimable: &'static str,
}

impl CgroupFiles {
    /// The room under the limit of the group at `path` and of each group above it that has one.
    fn headrooms(&self, path: &str) -> Vec<f64> {
        let own = self.dir.join(path.trim_start_matches('/'));
        own.ancestors()
            .take_while(|d| d.starts_with(&self.dir))
            .filter_map(|d| self.headroom(d))
            .collect()
    }

    fn headroom(&self, dir: &Path) -> Option<f64> {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        // "max" (v2) or a page-rounded 2^63 (v1) means none.
        let limit: f64 = read(self.limit)?.trim().parse().ok()?;
        if limit >= (1u64 << 62) as f64 {
            return None;
        }
        let usage: f64 = read(self.usage)?.trim().parse().ok()?;
        let reclaimable = read("memory.stat")
            .and_then(|stat| {
                stat.lines()
                    .find_map(|l| l.strip_prefix(self.reclaimable)?.strip_prefix(' '))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .unwrap_or(0.0);
        Some((limit - (usage - reclaimable).max(0.0)).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, files: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    /// A container's limit, v2 or v1, caps what is free: the tightest of its group and the
    /// groups above it, less what they use beyond reclaimable cache. No limit, no cap.
    #[test]
    fn a_control_groups_limit_caps_free_memory() {
        let root = std::env::temp_dir().join(format!("skein-cgroup-{}", std::process::id()));
        let gib = |n: f64| (n * GIB).to_string();
        let v2 = root.join("v2");
        write(
            &v2.join("kube"),
            &[("memory.max", &gib(16.0)), ("memory.current", &gib(1.0))],
        );
        write(
            &v2.join("kube/pod"),
            &[
                ("memory.max", "max\n"),
                ("memory.current", &gib(10.0)),
                (
                    "memory.stat",
                    &format!("anon 1\ninactive_file {}\n", gib(4.0)),
                ),
            ],
        );
        // The pod has no limit of its own; the group above it has 16 GiB, 1 GiB used.
        assert_eq!(cgroup_headroom(&v2, "0::/kube/pod\n"), Some(15.0 * GIB));
        write(&v2.join("kube/pod"), &[("memory.max", &gib(8.0))]);
        // 8 GiB, of which 10 − 4 are used.
        assert_eq!(cgroup_headroom(&v2, "0::/kube/pod\n"), Some(2.0 * GIB));

        let v1 = root.join("v1");
        write(
            &v1.join("memory"),
            &[
                ("memory.limit_in_bytes", "9223372036854771712\n"),
                ("memory.usage_in_bytes", &gib(3.0)),
            ],
        );
        let groups = "4:memory:/\n3:cpuset:/\n";
        assert_eq!(cgroup_headroom(&v1, groups), None, "unlimited");
        write(&v1.join("memory"), &[("memory.limit_in_bytes", &gib(4.0))]);
        assert_eq!(cgroup_headroom(&v1, groups), Some(1.0 * GIB));
        assert_eq!(cgroup_headroom(&root.join("none"), "0::/\n"), None);
        std::fs::remove_dir_all(&root).ok();
    }
}
