//! llama-server's slot endpoints: `GET /slots` (each sequence slot's state and its request's
//! progress) and `POST /slots/{id}?action=save|restore|erase` (with `serve --slot-save-path
//! DIR`; body `{"filename"}` for save and restore, a plain name inside DIR): a slot's KV cache
//! written to a file, read back into the prefix cache, or forgotten
//! (`corelm_engine::Engine::save_slot`: what a slot holds here is the whole blocks of its
//! tokens, and a restore serves any slot's next request that opens with them).

use crate::api::ApiError;
use crate::S;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use corelm_engine::batcher::{SlotAction, SlotOp, Work};
use serde_json::{json, Value};
use std::collections::HashMap;

/// llama-server's `GET /slots`: each sequence slot, whether it is processing, and its
/// request's progress (the last request's when idle); `?fail_on_no_slot=1` answers 503 when
/// none is idle.
pub(crate) async fn slots(State(st): S, headers: HeaderMap, Query(q): Query<HashMap<String, String>>) -> Response {
    let r = crate::check_auth(&st, &headers).and_then(|_| {
        use std::sync::atomic::Ordering::Relaxed;
        let slots = &st.stats.slots;
        if q.get("fail_on_no_slot").is_some_and(|v| !v.is_empty()) && slots.iter().all(|s| s.busy.load(Relaxed)) {
            return Err(ApiError::new(axum::http::StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", None, "no slot available"));
        }
        let all: Vec<Value> = slots
            .iter()
            .enumerate()
            .map(|(id, s)| {
                let busy = s.busy.load(Relaxed);
                let mut v = json!({"id": id, "n_ctx": st.cfg.ctx_size, "speculative": st.speculative, "is_processing": busy});
                let task = s.task.load(Relaxed);
                if task > 0 {
                    v["id_task"] = json!(task);
                    v["n_prompt_tokens"] = json!(s.n_prompt.load(Relaxed));
                    v["n_prompt_tokens_processed"] = json!(s.n_prompt_processed.load(Relaxed));
                    v["n_prompt_tokens_cache"] = json!(s.n_prompt_cached.load(Relaxed));
                    let (remain, decoded) = (s.n_remain.load(Relaxed), s.n_decoded.load(Relaxed));
                    v["next_token"] = json!([{"has_next_token": busy, "n_remain": remain, "n_decoded": decoded}]);
                }
                v
            })
            .collect();
        Ok(axum::Json(Value::Array(all)).into_response())
    });
    crate::counted(&st, "slots", r)
}

/// llama-server's `POST /slots/{id}?action=save|restore|erase` (see the module doc).
pub(crate) async fn slot_action(State(st): S, headers: HeaderMap, Path(id): Path<String>, Query(q): Query<HashMap<String, String>>, body: Bytes) -> Response {
    let r = async {
        crate::check_auth(&st, &headers)?;
        let invalid = |param: &str, msg: String| ApiError { param: Some(param.into()), ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", None, msg) };
        let Some(dir) = &st.cfg.slot_save_path else {
            let msg = "this server does not save or restore slots: start it with --slot-save-path DIR";
            return Err(ApiError::new(StatusCode::NOT_IMPLEMENTED, "not_supported_error", None, msg));
        };
        let slot: usize = id.parse().map_err(|_| invalid("id_slot", format!("invalid slot id {id:?}")))?;
        let action = q.get("action").map_or("", String::as_str);
        let file = || -> Result<String, ApiError> {
            let v: Value = serde_json::from_slice(&body).map_err(|e| invalid("filename", format!("the body is not JSON: {e}")))?;
            let name = v.get("filename").and_then(Value::as_str).ok_or_else(|| invalid("filename", "`filename` (a string) is required".into()))?;
            valid_filename(name).map_err(|why| invalid("filename", format!("invalid filename {name:?}: {why}")))?;
            Ok(name.to_string())
        };
        let (op, filename) = match action {
            "save" => file().map(|f| (SlotOp::Save(dir.join(&f)), Some(f)))?,
            "restore" => file().map(|f| (SlotOp::Restore(dir.join(&f)), Some(f)))?,
            "erase" => (SlotOp::Erase, None),
            _ => return Err(invalid("action", format!("invalid action {action:?}: save, restore or erase"))),
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = Work::Slot(SlotAction { slot, op: op.clone(), model: st.cfg.model_id.clone(), reply: Box::new(move |r| drop(tx.send(r))) });
        let t0 = std::time::Instant::now();
        if st.tx.lock().unwrap_or_else(|e| e.into_inner()).send(work).is_err() {
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", None, "the engine has stopped"));
        }
        let r = rx.await.map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", None, "the engine dropped the action"))?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let io = r.map_err(|e| {
            let status = if matches!(op, SlotOp::Save(_)) { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::BAD_REQUEST };
            let kind = if status == StatusCode::BAD_REQUEST { "invalid_request_error" } else { "server_error" };
            ApiError::new(status, kind, None, format!("unable to {action} slot {slot}: {e}"))
        })?;
        let v = match op {
            SlotOp::Save(_) => json!({"id_slot": slot, "filename": filename, "n_saved": io.n_tokens, "n_written": io.n_bytes, "timings": {"save_ms": ms}}),
            SlotOp::Restore(_) => json!({"id_slot": slot, "filename": filename, "n_restored": io.n_tokens, "n_read": io.n_bytes, "timings": {"restore_ms": ms}}),
            SlotOp::Erase => json!({"id_slot": slot, "n_erased": io.n_tokens}),
        };
        Ok(axum::Json(v).into_response())
    }
    .await;
    crate::counted(&st, "slots", r)
}

/// A file name inside the save directory, as llama-server's `fs_validate_filename` allows:
/// no directories, no control characters, not `.` or `..`, at most 255 bytes.
fn valid_filename(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 255 {
        return Err("it must be 1 to 255 bytes long");
    }
    if name == "." || name == ".." {
        return Err("it names a directory");
    }
    if name.chars().any(|c| c.is_control() || matches!(c, '/' | '\\' | ':')) {
        return Err("it must be a plain name, without directories or control characters");
    }
    if name.trim() != name {
        return Err("it starts or ends with white space");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn filenames_stay_inside_the_save_directory() {
        for ok in ["a.bin", "slot 0.kv", "..x"] {
            assert_eq!(super::valid_filename(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".", "..", "../x", "a/b", "a\\b", "c:x", " a", "a\n", &"x".repeat(256)] {
            assert!(super::valid_filename(bad).is_err(), "{bad:?}");
        }
    }
}
