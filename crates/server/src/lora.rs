//! llama-server's LoRA endpoints: `GET /lora-adapters` lists the adapters `serve --lora`
//! loaded (`id`, `path`, `scale`, `task_name`, `prompt_prefix`); `POST /lora-adapters` with
//! `[{"id", "scale"}]` sets the server's scales (adapters left out at 0) for the requests
//! that come after; a request's own `lora` field, in the same form, overrides them for that
//! request. Every generation request is handed to the engine with its scales; the batcher runs
//! requests of different scales in turn, not in one step (`batcher::Request::lora`).

use crate::{counted, ApiError, S};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use corelm_engine::lora::Adapter;
use serde_json::{json, Value};
use std::sync::Mutex;

/// The adapters and the server's scales.
pub(crate) struct Loras {
    list: Vec<Value>,
    scales: Mutex<Vec<f32>>,
}

impl Loras {
    pub(crate) fn new(adapters: &[Adapter]) -> Loras {
        let list = adapters
            .iter()
            .enumerate()
            .map(|(id, a)| json!({"id": id, "path": a.path.display().to_string(), "task_name": a.task_name, "prompt_prefix": a.prompt_prefix}))
            .collect();
        Loras { list, scales: Mutex::new(adapters.iter().map(|a| a.scale).collect()) }
    }

    fn scales(&self) -> std::sync::MutexGuard<'_, Vec<f32>> {
        self.scales.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The scales a request runs at: its `lora` field's, else the server's; `None` without
    /// adapters.
    pub(crate) fn resolve(&self, field: Option<&Value>) -> Result<Option<Vec<f32>>, ApiError> {
        let field = field.filter(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()));
        if self.list.is_empty() {
            return match field {
                Some(_) => Err(ApiError::bad("lora", "no LoRA adapters are loaded (serve --lora FILE)")),
                None => Ok(None),
            };
        }
        let given = field.map(|v| parse(v, "lora", self.list.len())).transpose()?;
        let mut scales = vec![0.0; self.list.len()];
        match given {
            Some(pairs) => pairs.into_iter().for_each(|(id, s)| scales[id] = s),
            None => scales.copy_from_slice(&self.scales()),
        }
        Ok(Some(scales))
    }
}

/// `[{"id": n, "scale": x}, …]`: ids below `n` adapters, finite scales.
fn parse(v: &Value, field: &str, n: usize) -> Result<Vec<(usize, f32)>, ApiError> {
    let Some(items) = v.as_array() else {
        return Err(ApiError::bad(field, format!("{field} must be a list of {{\"id\", \"scale\"}} objects")));
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let id = item.get("id").and_then(Value::as_u64).ok_or_else(|| ApiError::bad(&at, format!("{at} needs an integer \"id\"")))? as usize;
        if id >= n {
            return Err(ApiError::bad(&at, format!("{at}: no adapter has id {id} ({n} loaded; GET /lora-adapters lists them)")));
        }
        let scale = match item.get("scale") {
            None => 0.0,
            Some(s) => s.as_f64().filter(|s| s.is_finite()).ok_or_else(|| ApiError::bad(&at, format!("{at}: \"scale\" must be a number")))? as f32,
        };
        out.push((id, scale));
    }
    Ok(out)
}

/// `GET /lora-adapters`.
pub(crate) async fn list(State(st): S, headers: HeaderMap) -> Response {
    let r = crate::check_auth(&st, &headers).map(|()| {
        let scales = st.lora.scales().clone();
        let body: Vec<Value> = st.lora.list.iter().zip(scales).map(|(a, s)| {
            let mut a = a.clone();
            a["scale"] = json!(s);
            a
        }).collect();
        Json(body).into_response()
    });
    counted(&st, "lora-adapters", r)
}

/// `POST /lora-adapters`.
pub(crate) async fn set(State(st): S, headers: HeaderMap, body: Bytes) -> Response {
    let r = (|| {
        crate::check_auth(&st, &headers)?;
        let v: Value = serde_json::from_slice(&body).map_err(|e| ApiError::bad("body", format!("the body is not JSON: {e}")))?;
        if st.lora.list.is_empty() {
            return Err(ApiError::bad("body", "no LoRA adapters are loaded (serve --lora FILE)"));
        }
        let pairs = parse(&v, "body", st.lora.list.len())?;
        let mut scales = st.lora.scales();
        scales.iter_mut().for_each(|s| *s = 0.0);
        pairs.into_iter().for_each(|(id, s)| scales[id] = s);
        Ok(Json(json!({"success": true})).into_response())
    })();
    counted(&st, "lora-adapters", r)
}
