//! The web console on the HTTP port: one static page (`assets/`, embedded
//! with `include_str!`, no CDN) and the JSON API under `/api/` it uses.
//!
//! Every `/api` call is served by calling the public gRPC service (`grpc::api::Api`)
//! in process with the caller's token in the request metadata, so auth,
//! validation, read barriers and leader forwarding are the gRPC path's own:
//! a write reaching a follower is forwarded to the leader exactly as a gRPC
//! call is. The token comes from an `Authorization: Bearer` header or the
//! `kairos_token` cookie (HttpOnly, SameSite=Strict) set by `POST /api/login`.
//! Without `--auth-token-file` the API is open, like the gRPC port.
//! Every POST needs the header `X-Kairos-Action: 1`, which a cross-site form
//! cannot send, so actions cannot be triggered from another origin.

mod api;
mod json;
mod watch;

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tonic::metadata::MetadataValue;

use crate::grpc::api::Api;
use crate::node::Node;

/// Header every console POST must carry (cross-site protection).
pub const ACTION_HEADER: &str = "x-kairos-action";
/// Name of the login cookie.
pub const TOKEN_COOKIE: &str = "kairos_token";
/// Longest query string value accepted (a page token is a run id: job id + 32).
const QUERY_VALUE_MAX_BYTES: usize = 256;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The console's routes: the page, its assets and `/api/...`.
pub fn router() -> Router<Arc<Node>> {
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route(
            "/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
        .route(
            "/app.css",
            get(|| asset("text/css; charset=utf-8", APP_CSS)),
        )
        .route("/api/login", post(api::login))
        .route("/api/logout", post(api::logout))
        .route("/api/cluster", get(api::cluster))
        .route("/api/jobs", get(api::jobs))
        .route("/api/jobs/{id}", get(api::job))
        .route("/api/jobs/{id}/runs", get(api::job_runs))
        .route("/api/jobs/{id}/{action}", post(api::job_action))
        .route("/api/runs", get(api::runs))
        .route("/api/runs/retry", post(api::retry_run))
        .route("/api/watch", get(watch::watch))
        .layer(axum::middleware::from_fn(guard_actions))
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
            ),
        ],
        body,
    )
        .into_response()
}

/// Refuses a POST without `X-Kairos-Action` before any handler runs.
async fn guard_actions(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if req.method() == Method::POST && !req.headers().contains_key(ACTION_HEADER) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "X-Kairos-Action: header required on POST (cross-site requests are refused)",
        )
        .into_response();
    }
    next.run(req).await
}

/// An error answer: `{"error": message}` with an HTTP status.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// 400 naming the field and the rule.
    pub fn field(field: &str, rule: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::BAD_REQUEST, format!("{field}: {rule}"))
    }
}

impl From<tonic::Status> for ApiError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code as C;
        let status = match s.code() {
            C::InvalidArgument | C::OutOfRange => StatusCode::BAD_REQUEST,
            C::Unauthenticated => StatusCode::UNAUTHORIZED,
            C::PermissionDenied => StatusCode::FORBIDDEN,
            C::NotFound => StatusCode::NOT_FOUND,
            C::AlreadyExists | C::Aborted | C::FailedPrecondition => StatusCode::CONFLICT,
            C::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            C::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            C::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, s.message())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json::obj([("error", self.message.into())]);
        (self.status, json_body(&body)).into_response()
    }
}

/// A JSON answer.
pub fn json_body(v: &json::Json) -> Response {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        v.to_string(),
    )
        .into_response()
}

/// The bearer token of a console request: header first, then the login cookie.
pub fn request_token(headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let cookie = || {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|c| c.trim().strip_prefix("kairos_token="))
    };
    bearer.or_else(cookie).map(str::to_string)
}

/// What a console call brings to the gRPC service: the token and request id.
pub struct Caller {
    token: Option<String>,
    request_id: Option<String>,
}

impl Caller {
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let request_id = headers
            .get(kairos_client::REQUEST_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        Caller {
            token: request_token(headers),
            request_id,
        }
    }

    /// A gRPC request carrying this caller's token and request id, as a client would send it.
    pub fn request<T>(&self, msg: T) -> Result<tonic::Request<T>, ApiError> {
        let mut req = tonic::Request::new(msg);
        if let Some(t) = &self.token {
            let v: MetadataValue<_> = format!("Bearer {t}").parse().map_err(|_| {
                ApiError::new(StatusCode::UNAUTHORIZED, "token: not a valid header value")
            })?;
            req.metadata_mut().insert(kairos_client::AUTH_HEADER, v);
        }
        if let Some(id) = &self.request_id {
            let v: MetadataValue<_> = id
                .parse()
                .map_err(|_| ApiError::field("x-kairos-request-id", "not a valid header value"))?;
            req.metadata_mut()
                .insert(kairos_client::REQUEST_ID_HEADER, v);
        }
        Ok(req)
    }
}

pub fn service(node: &Arc<Node>) -> Api {
    Api { node: node.clone() }
}

/// Query parameters, percent-decoded, each at most `QUERY_VALUE_MAX_BYTES`.
pub struct Params(HashMap<String, String>);

impl Params {
    pub fn parse(query: Option<&str>) -> Result<Self, ApiError> {
        let mut map = HashMap::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = decode(k).ok_or_else(|| ApiError::field("query", "bad percent-encoding"))?;
            let v = decode(v).ok_or_else(|| ApiError::field(&k, "bad percent-encoding"))?;
            if v.len() > QUERY_VALUE_MAX_BYTES {
                return Err(ApiError::field(
                    &k,
                    format!("at most {QUERY_VALUE_MAX_BYTES} bytes, got {}", v.len()),
                ));
            }
            map.insert(k, v);
        }
        Ok(Params(map))
    }

    /// A text parameter ("" when absent).
    pub fn text(&self, name: &str) -> &str {
        self.0.get(name).map_or("", String::as_str)
    }

    /// A number parameter in `min..=max`, or `default` when absent.
    pub fn number(&self, name: &str, min: i64, max: i64, default: i64) -> Result<i64, ApiError> {
        let Some(v) = self.0.get(name).filter(|v| !v.is_empty()) else {
            return Ok(default);
        };
        v.parse::<i64>()
            .ok()
            .filter(|n| (min..=max).contains(n))
            .ok_or_else(|| {
                ApiError::field(
                    name,
                    format!("a whole number from {min} to {max}, got {v:?}"),
                )
            })
    }
}

fn decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_decoded_bounded_and_named_in_errors() {
        let p = Params::parse(Some("prefix=a%2Db&group=g+1&page_size=20")).unwrap();
        assert_eq!(p.text("prefix"), "a-b");
        assert_eq!(p.text("group"), "g 1");
        assert_eq!(p.number("page_size", 1, 500, 50).unwrap(), 20);
        assert_eq!(p.number("absent", 1, 500, 50).unwrap(), 50);
        let e = p.number("page_size", 1, 10, 5).err().unwrap();
        assert!(e.message.starts_with("page_size:"), "{}", e.message);
        let long = format!("prefix={}", "x".repeat(QUERY_VALUE_MAX_BYTES + 1));
        let e = Params::parse(Some(&long)).err().unwrap();
        assert!(e.message.starts_with("prefix: at most"), "{}", e.message);
        assert!(Params::parse(Some("prefix=%zz")).is_err());
    }

    #[test]
    fn the_token_comes_from_the_header_before_the_cookie() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; kairos_token=fromcookie".parse().unwrap(),
        );
        assert_eq!(request_token(&h).as_deref(), Some("fromcookie"));
        h.insert(header::AUTHORIZATION, "Bearer fromheader".parse().unwrap());
        assert_eq!(request_token(&h).as_deref(), Some("fromheader"));
    }
}
