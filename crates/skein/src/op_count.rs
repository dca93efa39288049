//! How many libtorch operator calls a piece of work makes (`csrc/op_count.cpp`, through the
//! RecordFunction hook libtorch's profiler uses).
//!
//! A decode step's kernels are tiny, so on a GPU its time is the host's: one dispatch per call
//! and a kernel launch per computing call. The counts are the same on every device for the
//! same ops, so a change to the decode path can be weighed on a machine without a GPU
//! (`skein bench` prints them per decode step; docs/speed.md). Composite ops may decompose
//! differently by device (attention above all), which the counts then show on that device.

use std::ffi::{c_char, CStr};

/// The calls counted over one piece of work; by name, most frequent first.
#[derive(Debug, Clone, Default)]
pub struct OpCounts {
    /// Every call, those made inside other calls included.
    pub all: u64,
    /// The calls the program made itself.
    pub top_level: Vec<(String, u64)>,
    /// The lowest calls that compute: not views, metadata, allocations or autograd's backward
    /// nodes (whose computing calls are inside them), and with no computing call inside (a
    /// linear's matmul, not the linear; a cast's copy, and nothing for a cast to the same
    /// dtype). On a GPU, one kernel launch each. One made inside a
    /// top-level call is named after both: `aten::linear > aten::mm`. A multi-tensor op
    /// (`aten::_foreach_*`, `aten::_fused_adamw_`) counts once, as the launch it is on a GPU (a few for a list of
    /// very many or very large tensors), though the CPU runs it as a per-tensor loop.
    pub computing: Vec<(String, u64)>,
}

impl OpCounts {
    /// Calls the program made itself.
    pub fn top_level_total(&self) -> u64 {
        self.top_level.iter().map(|(_, n)| n).sum()
    }

    /// Computing calls: on a GPU, the kernels launched.
    pub fn computing_total(&self) -> u64 {
        self.computing.iter().map(|(_, n)| n).sum()
    }

    /// The calls made beyond `base`'s, name by name (none below zero): what a longer piece of
    /// work adds to a shorter one that does the same first.
    pub fn beyond(&self, base: &OpCounts) -> OpCounts {
        let minus = |list: &[(String, u64)], less: &[(String, u64)]| {
            let mut out: Vec<(String, u64)> = list
                .iter()
                .map(|(name, n)| {
                    let fewer = less.iter().find(|(m, _)| m == name).map_or(0, |(_, c)| *c);
                    (name.clone(), n.saturating_sub(fewer))
                })
                .filter(|(_, n)| *n > 0)
                .collect();
            out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            out
        };
        OpCounts {
            all: self.all.saturating_sub(base.all),
            top_level: minus(&self.top_level, &base.top_level),
            computing: minus(&self.computing, &base.computing),
        }
    }
}

thread_local! {
    /// Whether this thread is inside [`count`].
    static COUNTING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `work` and counts the operator calls this thread makes meanwhile (the engine and a
/// bench's steps run on their caller's thread; libtorch's own worker threads compute parts of
/// a call and make none). Counts do not nest: the shim keeps one set of totals, which an
/// inner count would read and stop, so a count inside another panics.
pub fn count<T>(work: impl FnOnce() -> T) -> (T, OpCounts) {
    let counting = Counting::start();
    let out = work();
    let all = counting.stop();
    let counts = OpCounts {
        all: all.max(0) as u64,
        top_level: by_name(true),
        computing: by_name(false),
    };
    (out, counts)
}

/// This thread's count, under way: stopped by [`Counting::stop`], or when dropped (`work`
/// panicked), so the shim stops counting and the thread can count again.
struct Counting;

impl Counting {
    fn start() -> Self {
        assert!(
            !COUNTING.replace(true),
            "op_count::count inside another: counts do not nest"
        );
        // SAFETY: the shim's functions take no pointers but the name buffer, which is live and
        // whose length is passed.
        unsafe { skein_op_count_start() };
        Counting
    }

    /// Every call counted since the start.
    fn stop(self) -> i64 {
        let all = unsafe { skein_op_count_stop() };
        COUNTING.set(false);
        std::mem::forget(self);
        all
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        unsafe { skein_op_count_stop() };
        COUNTING.set(false);
    }
}

fn by_name(top: bool) -> Vec<(String, u64)> {
    let names = unsafe { skein_op_count_names(top) };
    let mut out = Vec::with_capacity(names.max(0) as usize);
    let mut buf = [0 as c_char; 256];
    for i in 0..names {
        // SAFETY: see `count`.
        let n = unsafe { skein_op_count_entry(top, i, buf.as_mut_ptr(), buf.len()) };
        if n >= 0 {
            // SAFETY: the shim wrote a NUL-terminated name within the buffer.
            let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
            out.push((name.to_string_lossy().into_owned(), n as u64));
        }
    }
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

extern "C" {
    fn skein_op_count_start();
    fn skein_op_count_stop() -> i64;
    fn skein_op_count_names(top: bool) -> i64;
    fn skein_op_count_entry(top: bool, i: i64, name: *mut c_char, name_len: usize) -> i64;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    /// An inner count would read the outer one's totals and stop it: refused. (The shim's
    /// state is per thread, and this test's thread ends with it.)
    #[test]
    fn a_count_inside_another_panics() {
        let nested = std::thread::spawn(|| count(|| count(|| ()))).join();
        let why = nested.expect_err("a nested count ran");
        assert!(crate::panic_message::panic_message(&*why).contains("do not nest"));
    }

    /// Work that panics ends its count: the thread counts again afterwards, from nothing.
    #[test]
    fn a_count_whose_work_panicked_is_over() {
        let again = std::thread::spawn(|| {
            let panicked = std::panic::catch_unwind(|| count(|| panic!("the work failed")));
            assert!(panicked.is_err());
            count(|| ()).1.all
        });
        assert_eq!(again.join().expect("a second count ran"), 0);
    }

    /// Each top-level call is counted once by name, and each computing call at its lowest.
    #[test]
    fn counts_top_level_calls_and_the_computing_calls_beneath_them() {
        let a = Tensor::ones([4, 4], (Kind::Float, tch::Device::Cpu));
        let (_, counts) = count(|| {
            let b = &a + &a;
            let c = (&b + &a).to_kind(Kind::Float);
            c.matmul(&a.transpose(0, 1))
        });
        let of = |list: &[(String, u64)], name: &str| {
            list.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c)
        };
        assert_eq!(of(&counts.top_level, "aten::add"), 2, "{counts:?}");
        assert_eq!(of(&counts.top_level, "aten::matmul"), 1, "{counts:?}");
        assert_eq!(counts.top_level_total(), 5, "{counts:?}");
        // The matmul computes through the mm inside it, named after both; a cast to the same
        // dtype computes nothing.
        let mm = of(&counts.computing, "aten::matmul > aten::mm");
        assert_eq!(mm, 1, "{counts:?}");
        assert_eq!(of(&counts.computing, "aten::add"), 2, "{counts:?}");
        assert_eq!(counts.computing_total(), 3, "{counts:?}");
        assert!(counts.all > counts.top_level_total(), "{counts:?}");
        // Nothing is counted once the work is done.
        let (_, none) = count(|| ());
        assert_eq!(none.all, 0);
        // What a longer piece of work adds: here one more add.
        let (_, more) = count(|| {
            let b = &a + &a;
            let c = (&b + &a).to_kind(Kind::Float);
            let _ = c.matmul(&a.transpose(0, 1));
            &c + &a
        });
        let added = more.beyond(&counts);
        assert_eq!(added.computing, [("aten::add".to_string(), 1)], "{added:?}");
        assert_eq!(added.top_level, [("aten::add".to_string(), 1)], "{added:?}");
    }

    /// A backward node computes through the calls inside it; a view's, which passes its
    /// gradient on, computes nothing.
    #[test]
    fn backward_nodes_count_only_the_calls_inside_them() {
        let x = Tensor::ones([3, 4], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
        let y = (x.view([12]) * 2.0).sum(Kind::Float);
        let (_, counts) = count(|| y.backward());
        let names: Vec<&str> = counts.computing.iter().map(|(n, _)| n.as_str()).collect();
        assert!(
            names.iter().all(|n| !n.contains("ViewBackward0")),
            "{names:?}"
        );
        assert!(
            names
                .iter()
                .any(|n| n.contains("MulBackward") && n.contains(" > aten::")),
            "{names:?}"
        );
    }

    /// A multi-tensor op is one computing call, though the CPU runs it tensor by tensor: an
    /// AdamW step over three tensors makes as many computing calls as over one, in either
    /// form.
    #[test]
    fn a_multi_tensor_op_counts_once() {
        use crate::trainer::update::optim_ops::{adamw_step, AdamwForm, AdamwGroup, AdamwScalars};
        let scalars = AdamwScalars::new(0.5, 1e-3, 0.1, 0.9, 0.99, 1e-8, 1);
        for form in [AdamwForm::OpByOp, AdamwForm::Fused] {
            let counts = |n: i64| {
                let ts: Vec<Tensor> = (1..=n)
                    .map(|k| Tensor::ones([k, 4], (Kind::Float, tch::Device::Cpu)))
                    .collect();
                let refs: Vec<&Tensor> = ts.iter().collect();
                let group = AdamwGroup {
                    params: &refs,
                    grads: &refs,
                    m: &refs,
                    v: &refs,
                };
                count(|| adamw_step(&group, &scalars, form).unwrap()).1
            };
            let (one, three) = (counts(1), counts(3));
            assert!(
                one.computing
                    .iter()
                    .all(|(name, _)| name.starts_with("aten::_foreach_")
                    || name.starts_with("aten::_fused_adamw_")
                    // The step number the fused op reads, filled once for the group.
                    || name == "aten::full > aten::fill_"),
                "{one:?}"
            );
            assert_eq!(one.computing, three.computing);
            if form == AdamwForm::OpByOp {
                assert!(
                    three.all > one.all,
                    "the CPU's loop makes its calls all the same"
                );
            }
        }
    }
}
