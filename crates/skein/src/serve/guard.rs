//! What every request passes before its route: the API key (all routes but `/health`, which
//! load balancers probe without credentials) and the in-flight limit (503 at once, never a
//! queue that grows without bound; a streamed answer is in flight until its stream ends).

use super::error::ApiError;
use super::state::ServeState;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;

pub async fn guard(State(s): State<ServeState>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/health" {
        return next.run(req).await;
    }
    if let Some(key) = &s.0.config.api_key {
        let sent = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !sent.is_some_and(|sent| same(sent.as_bytes(), key.as_bytes())) {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key: send `Authorization: Bearer <key>`",
            )
            .into_response();
        }
    }
    let Ok(permit) = s.0.permits.clone().try_acquire_owned() else {
        return ApiError::unavailable(format!(
            "the server is handling its limit of {} requests at once (--max-concurrent); retry shortly",
            s.0.config.max_concurrent
        ))
        .into_response();
    };
    let response = next.run(req).await;
    if !is_event_stream(&response) {
        return response;
    }
    // A stream is generated while its body is sent: its permit goes with the body, which is
    // dropped when the stream ends or its client leaves.
    response.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _held = &permit;
            chunk
        }))
    })
}

fn is_event_stream(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"))
}

/// Equality in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_compare_whole() {
        assert!(super::same(b"abc", b"abc"));
        assert!(!super::same(b"abc", b"abd"));
        assert!(!super::same(b"abc", b"ab"));
    }
}
