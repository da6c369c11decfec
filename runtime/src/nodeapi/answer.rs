//! How the node API answers: a failure as JSON with its stable code ([`ApiError`]), a JSON
//! operation's success and request body as the contract types them, and the machine name of a
//! route, checked.

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, Path};
use axum::http::{HeaderValue, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::failure::{self, ApiFailure};
use super::types::{ErrorCode, JsonCall, validate_machine_name};
use crate::vmm::VmmError;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The stable code of a response, for metrics.
#[derive(Debug, Clone, Copy)]
pub(super) struct ResponseCode(pub(super) &'static str);

/// A handler failure: rendered as JSON with the failure's status.
#[derive(Debug)]
pub struct ApiError(pub ApiFailure);

impl From<ApiFailure> for ApiError {
    fn from(failure: ApiFailure) -> Self {
        Self(failure)
    }
}

impl From<VmmError> for ApiError {
    fn from(error: VmmError) -> Self {
        Self(failure::map_vmm_error(&error))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let code = self.0.body.code.label();
        let mut response = json_response(status, &self.0.body);
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response.extensions_mut().insert(ResponseCode(code));
        response
    }
}

pub(super) fn json_response<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => {
            let mut response = Response::new(Body::from(bytes));
            *response.status_mut() = status;
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(_) => {
            let mut response = Response::new(Body::from(
                r#"{"code":"RuntimeError","message":"cannot serialize the answer"}"#,
            ));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
    }
}

pub(super) fn ok<T: Serialize>(status: StatusCode, body: &T) -> Response {
    let mut response = json_response(status, body);
    response.extensions_mut().insert(ResponseCode("OK"));
    response
}

/// A success of the JSON operation `C`, its body of the type the contract gives it.
pub(super) fn answer<C: JsonCall>(status: StatusCode, body: &C::Response) -> Response {
    ok(status, body)
}

/// The body of a request of the JSON operation `C`, read as the type the contract gives it.
pub(super) fn body_of<C: JsonCall>(body: Result<Bytes, BytesRejection>) -> Result<C::Request, ApiError> {
    parse_body(body)
}

pub(super) type ApiResult = Result<Response, ApiError>;

pub(super) fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let bytes = body.map_err(|rejection| {
        let status = rejection.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiFailure::new(
                ErrorCode::PayloadTooLarge,
                format!("request body exceeds {MAX_BODY_BYTES} bytes"),
            )
        } else {
            ApiFailure::new(ErrorCode::InvalidRequest, rejection.body_text())
        }
    })?;
    let invalid = |why: String| ApiError(ApiFailure::new(ErrorCode::InvalidRequest, why));
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| invalid(format!("invalid JSON body: {e}")))?;
    // serde would read a struct from an array too; the protocol speaks objects only.
    if !value.is_object() {
        return Err(invalid("invalid JSON body: expected a JSON object".into()));
    }
    serde_json::from_value(value).map_err(|e| invalid(format!("invalid JSON body: {e}")))
}

/// The `{name}` of a machine route, checked by [`validate_machine_name`]. A name that is not
/// valid UTF-8 once percent-decoded, or not a valid machine name, is a 400 with a JSON body
/// (axum's own path rejection would be plain text).
pub(super) struct MachineName(pub(super) String);

impl<S: Send + Sync> FromRequestParts<S> for MachineName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(name) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| {
                ApiError(ApiFailure::new(
                    ErrorCode::InvalidRequest,
                    format!("the machine name in the path: {}", rejection.body_text()),
                ))
            })?;
        validate_machine_name(&name)
            .map_err(|message| ApiError(ApiFailure::new(ErrorCode::InvalidRequest, message)))?;
        Ok(MachineName(name))
    }
}

pub(super) fn not_found(name: &str) -> ApiError {
    ApiError(ApiFailure::new(
        ErrorCode::MachineNotFound,
        format!("machine '{name}' not found"),
    ))
}
