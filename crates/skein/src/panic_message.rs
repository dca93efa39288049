//! What a caught panic said: libtorch's errors reach Rust as panics in tch's plain calls, and
//! a caller that keeps going reports them as errors.

use std::any::Any;

/// The message a panic was raised with (`panic!("…")` gives a `&str` or a `String`).
pub fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message")
}
