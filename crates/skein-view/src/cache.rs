//! What was made of a file, kept while the file is unchanged: a page reads one trajectory
//! after another of the same step, and reloads the same curves. Bounded in entries and in the
//! bytes they hold; the least recently used go first.

use std::collections::VecDeque;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// A version of a file: a rewrite (a new file renamed over it, or one written in place)
/// changes one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    modified: SystemTime,
    len: u64,
    inode: u64,
}

impl Stamp {
    pub fn of(meta: &Metadata) -> Stamp {
        Stamp {
            modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            len: meta.len(),
            inode: meta.ino(),
        }
    }
}

struct Entry<V> {
    path: PathBuf,
    stamp: Stamp,
    bytes: usize,
    value: Arc<V>,
}

pub struct FileCache<V> {
    entries: Mutex<VecDeque<Entry<V>>>,
    max_entries: usize,
    max_bytes: usize,
}

impl<V> FileCache<V> {
    pub fn new(max_entries: usize, max_bytes: usize) -> FileCache<V> {
        FileCache {
            entries: Mutex::new(VecDeque::new()),
            max_entries,
            max_bytes,
        }
    }

    /// What was kept of this version of `path`, if anything.
    pub fn get(&self, path: &Path, stamp: Stamp) -> Option<Arc<V>> {
        let mut entries = self.lock();
        let at = entries
            .iter()
            .position(|e| e.path == path && e.stamp == stamp)?;
        let entry = entries.remove(at)?;
        let value = entry.value.clone();
        entries.push_front(entry);
        Some(value)
    }

    /// Keeps `value`, made of this version of `path` and holding `bytes`, in place of any
    /// other version; older entries leave to make room. A value larger than the whole cache
    /// is not kept.
    pub fn put(&self, path: &Path, stamp: Stamp, bytes: usize, value: Arc<V>) {
        let mut entries = self.lock();
        entries.retain(|e| e.path != path);
        if bytes > self.max_bytes || self.max_entries == 0 {
            return;
        }
        let mut held: usize = entries.iter().map(|e| e.bytes).sum();
        while entries.len() >= self.max_entries || held + bytes > self.max_bytes {
            let Some(oldest) = entries.pop_back() else {
                break;
            };
            held -= oldest.bytes;
        }
        entries.push_front(Entry {
            path: path.to_path_buf(),
            stamp,
            bytes,
            value,
        });
    }

    /// The bytes the entries kept hold, as they were counted when kept.
    pub fn held_bytes(&self) -> usize {
        self.lock().iter().map(|e| e.bytes).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry<V>>> {
        // A panic elsewhere while holding it leaves the list whole: each change is one call.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(len: u64) -> Stamp {
        Stamp {
            modified: SystemTime::UNIX_EPOCH,
            len,
            inode: 1,
        }
    }

    #[test]
    fn keeps_within_its_bytes_dropping_the_least_recently_used() {
        let cache = FileCache::new(10, 100);
        let (a, b, c) = (Path::new("a"), Path::new("b"), Path::new("c"));
        cache.put(a, stamp(1), 40, Arc::new('a'));
        cache.put(b, stamp(1), 40, Arc::new('b'));
        // Reading `a` makes `b` the oldest, which leaves for `c`.
        assert_eq!(cache.get(a, stamp(1)).as_deref(), Some(&'a'));
        cache.put(c, stamp(1), 40, Arc::new('c'));
        assert_eq!(cache.held_bytes(), 80);
        assert!(cache.get(b, stamp(1)).is_none());
        assert!(cache.get(a, stamp(1)).is_some() && cache.get(c, stamp(1)).is_some());
        // Too large to keep at all: not kept, and nothing else leaves for it.
        cache.put(b, stamp(1), 101, Arc::new('b'));
        assert_eq!(cache.held_bytes(), 80);
    }

    #[test]
    fn a_new_version_of_a_file_replaces_the_old_one() {
        let cache = FileCache::new(2, 100);
        let a = Path::new("a");
        cache.put(a, stamp(1), 10, Arc::new(1));
        assert!(cache.get(a, stamp(2)).is_none());
        cache.put(a, stamp(2), 20, Arc::new(2));
        assert_eq!(cache.get(a, stamp(2)).as_deref(), Some(&2));
        assert_eq!(cache.held_bytes(), 20);
        // And the count of entries is bounded too.
        cache.put(Path::new("b"), stamp(1), 1, Arc::new(3));
        cache.put(Path::new("c"), stamp(1), 1, Arc::new(4));
        assert!(cache.get(a, stamp(2)).is_none());
        assert_eq!(cache.held_bytes(), 2);
    }
}
