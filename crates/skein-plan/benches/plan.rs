//! Planning 100k rows (10k trajectories of ~10 transitions, long-tail lengths) over dp 8 and
//! 4 mini-batches. Run with `cargo bench -p skein-plan`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use skein_plan::{plan, PlanConfig, RowShape};

/// Long-tail lengths: mostly short, a few very long (a Pareto-like tail).
fn batch(trajectories: usize, turns: usize) -> Vec<RowShape> {
    let mut s = 0x1234_5678_u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut rows = Vec::new();
    for t in 0..trajectories {
        for k in 0..turns {
            let u = (next() % 10_000) as f64 / 10_000.0;
            let response = (32.0 / (1.0 - u * 0.995).powf(0.8)) as usize;
            rows.push(RowShape {
                trajectory: t,
                transition: Some(k),
                group: t / 8,
                prompt_len: 64 + 32 * k,
                response_len: response,
                loss_tokens: response,
            });
        }
    }
    rows
}

fn bench(c: &mut Criterion) {
    let rows = batch(10_000, 10);
    let cfg = PlanConfig {
        dp_size: 8,
        num_mini_batches: 4,
        ..Default::default()
    };
    let mut g = c.benchmark_group("plan");
    g.throughput(Throughput::Elements(rows.len() as u64));
    g.sample_size(20);
    g.bench_function("100k rows, dp 8, 4 mini-batches", |b| {
        b.iter(|| plan(&rows, &cfg).expect("plan"))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
