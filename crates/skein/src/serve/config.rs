//! What a server is told at start-up: limits, the served model's name, generation defaults.

/// Settings of one `skein serve` server.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// When set, every route but `GET /health` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Requests handled at once; one more is answered 503 at once, with `Retry-After`.
    pub max_concurrent: usize,
    /// Largest request body accepted; a larger one is answered 413.
    pub max_body_bytes: usize,
    /// The name `/v1/models` lists and requests' `model` must match.
    pub model_name: String,
    /// New tokens per completion when a request names none.
    pub default_max_tokens: usize,
    /// Longest context (prompt + completion) the engine holds; longer prompts are refused.
    pub capacity: i64,
    /// Most completions one request may ask for (`n`).
    pub max_n: usize,
    /// A trainer serving its policy: the temperature its update recomputes log-probs at
    /// (`rollout.sampling.temperature`). A request inside a rollout samples at it (its
    /// default) and is refused at any other, whose recorded log-probs would be off-policy.
    pub rollout_temperature: Option<f64>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            api_key: None,
            max_concurrent: 2048,
            max_body_bytes: 4 << 20,
            model_name: "skein".into(),
            default_max_tokens: 256,
            capacity: 2048,
            max_n: 64,
            rollout_temperature: None,
        }
    }
}
