//! The machine's free memory, which sizes are checked against before anything is allocated.

/// Bytes in a GiB, for messages.
pub const GIB: f64 = (1u64 << 30) as f64;

/// Free memory of this machine (MemAvailable) in bytes, when the system reports it.
pub fn available() -> Option<f64> {
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
