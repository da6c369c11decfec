//! The response, written by hand: an AdmissionReview v1 `response` (uid, denial, JSONPatch,
//! warnings) encoded straight into bytes. It exists for speed (the `handler` bench measures it);
//! the tests compare its bytes with kube-core's `AdmissionResponse`, the reference encoder.

use super::wire::*;

/// A finding as its `Display` writes it (`path: message [rule]`), built without the formatting
/// machinery.
pub(super) fn finding_text(finding: &smolvm_api::validate::Finding) -> String {
    let rule = finding.rule.as_str();
    let mut text = String::with_capacity(finding.path.len() + finding.message.len() + rule.len() + 5);
    text.push_str(&finding.path);
    text.push_str(": ");
    text.push_str(&finding.message);
    text.push_str(" [");
    text.push_str(rule);
    text.push(']');
    text
}

/// The `response` of an AdmissionReview as this webhook fills it in: the uid, a denial (code,
/// reason, message) or none, a JSONPatch, warnings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answer {
    pub(super) uid: String,
    pub(super) denial: Option<(u16, &'static str, String)>,
    pub(super) patch: Option<Vec<u8>>,
    pub(super) warnings: Option<Vec<String>>,
}

/// The response skeleton for a request: allowed, `uid` echoed.
pub(super) fn response_to(uid: &str) -> Answer {
    Answer {
        uid: uid.to_string(),
        denial: None,
        patch: None,
        warnings: None,
    }
}

pub(super) fn deny(mut response: Answer, code: u16, reason: &'static str, message: &str) -> Answer {
    response.denial = Some((code, reason, message.to_string()));
    response
}

/// `patch` as serde_json writes it, byte for byte (the tests compare): an `add` (all that
/// defaulting writes) is written here, field by field; any other operation by serde_json.
pub(super) fn patch_json(patch: &json_patch::Patch) -> Result<Vec<u8>, RequestError> {
    let failed =
        |e: serde_json::Error| RequestError::Internal(format!("encoding the patch: failed to serialize patch: {e}"));
    let mut out = Vec::with_capacity(64 * patch.0.len() + 2);
    out.push(b'[');
    for (i, op) in patch.0.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match op {
            json_patch::PatchOperation::Add(add) => {
                out.extend_from_slice(br#"{"op":"add","path":"#);
                serde_json::to_writer(&mut out, add.path.as_str()).map_err(failed)?;
                out.extend_from_slice(br#","value":"#);
                serde_json::to_writer(&mut out, &add.value).map_err(failed)?;
                out.push(b'}');
            }
            other => serde_json::to_writer(&mut out, other).map_err(failed)?,
        }
    }
    out.push(b']');
    Ok(out)
}

/// Appends `text` as a JSON string (serde_json's escaping: a string with nothing to escape, as a
/// uid or a reason has, is copied as it is).
fn put_str(out: &mut Vec<u8>, text: &str) -> Result<(), RequestError> {
    if !text.bytes().any(|c| c == b'"' || c == b'\\' || c < 0x20) {
        out.reserve(text.len() + 2);
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
        return Ok(());
    }
    serde_json::to_writer(&mut *out, text).map_err(|e| RequestError::Internal(format!("encoding the response: {e}")))
}

/// The start of every answer, up to the uid's value: [`ADMISSION_API_VERSION`] and
/// [`ADMISSION_KIND`] as JSON strings (the tests compare the whole answer with kube-core's).
const ANSWER_HEAD: &[u8] = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#;

/// Appends `n` in decimal.
fn put_decimal(out: &mut Vec<u8>, n: impl std::fmt::Display) {
    use std::io::Write;
    // Writing to a Vec cannot fail.
    let _ = write!(out, "{n}");
}

/// Appends `bytes` as JSON numbers separated by commas (the patch is an array of byte values on
/// the wire).
pub(super) fn put_decimals(out: &mut Vec<u8>, bytes: &[u8]) {
    for (i, byte) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        put_decimal(out, byte);
    }
}

/// The AdmissionReview carrying `response`, byte for byte as serde_json writes kube-core's
/// `AdmissionResponse::into_review()` (fields in declaration order, empty ones left out, the
/// patch as an array of byte values), without building those types.
pub(super) fn encode(response: Answer) -> Result<Vec<u8>, RequestError> {
    let Answer {
        uid,
        denial,
        patch,
        warnings,
    } = response;
    let mut out = Vec::with_capacity(160 + uid.len() + patch.as_ref().map_or(0, |p| 4 * p.len()));
    out.extend_from_slice(ANSWER_HEAD);
    put_str(&mut out, &uid)?;
    match &denial {
        None => out.extend_from_slice(br#","allowed":true,"status":{}"#),
        Some((code, reason, message)) => {
            out.extend_from_slice(br#","allowed":false,"status":{"status":"Failure""#);
            if *code != 0 {
                out.extend_from_slice(br#","code":"#);
                put_decimal(&mut out, code);
            }
            if !message.is_empty() {
                out.extend_from_slice(br#","message":"#);
                put_str(&mut out, message)?;
            }
            if !reason.is_empty() {
                out.extend_from_slice(br#","reason":"#);
                put_str(&mut out, reason)?;
            }
            out.push(b'}');
        }
    }
    if let Some(patch) = &patch {
        out.extend_from_slice(br#","patch":["#);
        put_decimals(&mut out, patch);
        out.extend_from_slice(br#"],"patchType":"JSONPatch""#);
    }
    if let Some(warnings) = &warnings {
        out.extend_from_slice(br#","warnings":["#);
        for (i, warning) in warnings.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            put_str(&mut out, warning)?;
        }
        out.push(b']');
    }
    out.extend_from_slice(b"}}");
    Ok(out)
}
