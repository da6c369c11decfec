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

/// `response` with `patch` (as JSON bytes, the encoding kube-core's `AdmissionResponse::with_patch`
/// uses).
pub(super) fn with_patch(mut response: Answer, patch: &json_patch::Patch) -> Result<Answer, RequestError> {
    let bytes = serde_json::to_vec(patch)
        .map_err(|e| RequestError::Internal(format!("encoding the patch: failed to serialize patch: {e}")))?;
    response.patch = Some(bytes);
    Ok(response)
}

/// Appends `text` as a JSON string (serde_json's escaping).
fn put_str(out: &mut Vec<u8>, text: &str) -> Result<(), RequestError> {
    serde_json::to_writer(&mut *out, text).map_err(|e| RequestError::Internal(format!("encoding the response: {e}")))
}

/// Appends `n` in decimal.
fn put_u16(out: &mut Vec<u8>, n: u16) {
    let mut digits = [0u8; 5];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// `byte` in decimal (the patch is an array of byte values on the wire).
pub(super) fn byte_decimal(byte: u8) -> &'static [u8] {
    static TABLE: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
        // Three bytes per value: the digits, left-aligned; the length follows from the value.
        (0..=255u16)
            .flat_map(|n| {
                let digits = [(n / 100) as u8, (n / 10 % 10) as u8, (n % 10) as u8].map(|d| b'0' + d);
                let skip = if n >= 100 {
                    0
                } else if n >= 10 {
                    1
                } else {
                    2
                };
                let mut out = [b' '; 3];
                out[..3 - skip].copy_from_slice(&digits[skip..]);
                out
            })
            .collect()
    });
    let len = if byte >= 100 {
        3
    } else if byte >= 10 {
        2
    } else {
        1
    };
    let at = 3 * usize::from(byte);
    &TABLE[at..at + len]
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
    out.extend_from_slice(br#"{"apiVersion":"#);
    put_str(&mut out, ADMISSION_API_VERSION)?;
    out.extend_from_slice(br#","kind":"#);
    put_str(&mut out, ADMISSION_KIND)?;
    out.extend_from_slice(br#","response":{"uid":"#);
    put_str(&mut out, &uid)?;
    match &denial {
        None => out.extend_from_slice(br#","allowed":true,"status":{}"#),
        Some((code, reason, message)) => {
            out.extend_from_slice(br#","allowed":false,"status":{"status":"Failure""#);
            if *code != 0 {
                out.extend_from_slice(br#","code":"#);
                put_u16(&mut out, *code);
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
        for (i, byte) in patch.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(byte_decimal(*byte));
        }
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
