//! Python values ⇄ JSON values, and the checks on Python inputs (logits rows, token ids).

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2};
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::errors::{Failure, Result};

/// How a non-finite float is written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum NonFinite {
    /// An error naming the path.
    Refuse,
    /// The strings `"nan"`, `"inf"`, `"-inf"` (the request format's spelling of logits).
    AsString,
}

/// A Python value (dicts, lists, tuples, strings, numbers, booleans, `None`, numpy arrays and
/// scalars) as JSON. `path` names the value in errors (`params.logit_bias[3]`).
pub fn to_json(obj: &Bound<'_, PyAny>, path: &str, nf: NonFinite) -> Result<Value> {
    to_json_depth(obj, path, nf, 0)
}

/// Nesting deeper than this is refused (a self-referencing list would recurse forever).
const MAX_DEPTH: usize = 128;

fn to_json_depth(obj: &Bound<'_, PyAny>, path: &str, nf: NonFinite, depth: usize) -> Result<Value> {
    if depth > MAX_DEPTH {
        return Err(Failure::argument(
            path,
            format!("nested more than {MAX_DEPTH} levels deep"),
        ));
    }
    let field = |p: &str| {
        if p.is_empty() {
            "value".to_string()
        } else {
            p.to_string()
        }
    };
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.cast::<PyInt>().is_ok() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::from(u));
        }
        return Err(Failure::argument(
            field(path),
            "integer outside the 64-bit range",
        ));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        let x = f.value();
        if x.is_finite() {
            return Ok(serde_json::Number::from_f64(x)
                .map(Value::Number)
                .unwrap_or(Value::Null));
        }
        return match nf {
            NonFinite::AsString => Ok(Value::String(
                if x.is_nan() {
                    "nan"
                } else if x > 0.0 {
                    "inf"
                } else {
                    "-inf"
                }
                .into(),
            )),
            NonFinite::Refuse => Err(Failure::parameter(
                field(path),
                format!("{x} is not a finite number"),
            )),
        };
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(
            s.to_str()
                .map_err(|e| Failure::argument(field(path), format!("not valid text: {e}")))?
                .to_string(),
        ));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = serde_json::Map::new();
        for (k, v) in d.iter() {
            let key = if let Ok(s) = k.cast::<PyString>() {
                s.to_str()
                    .map_err(|e| {
                        Failure::argument(field(path), format!("a key is not valid text: {e}"))
                    })?
                    .to_string()
            } else if k.cast::<PyInt>().is_ok() && k.cast::<PyBool>().is_err() {
                k.str()
                    .and_then(|s| s.to_str().map(str::to_string))
                    .map_err(|e| Failure::argument(field(path), e.to_string()))?
            } else {
                return Err(Failure::argument(
                    field(path),
                    format!("keys must be strings or integers, got {}", type_name(&k)),
                ));
            };
            let sub = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            map.insert(key, to_json_depth(&v, &sub, nf, depth + 1)?);
        }
        return Ok(Value::Object(map));
    }
    if obj.cast::<PyList>().is_ok() || obj.cast::<PyTuple>().is_ok() {
        let mut out = Vec::new();
        for (i, item) in obj
            .try_iter()
            .map_err(|e| Failure::argument(field(path), e.to_string()))?
            .enumerate()
        {
            let item = item.map_err(|e| Failure::argument(field(path), e.to_string()))?;
            out.push(to_json_depth(
                &item,
                &format!("{path}[{i}]"),
                nf,
                depth + 1,
            )?);
        }
        return Ok(Value::Array(out));
    }
    if obj.cast::<PyBytes>().is_ok() {
        return Err(Failure::argument(
            field(path),
            "bytes are not accepted here; pass text (str)",
        ));
    }
    // numpy arrays and scalars: their Python equivalent
    if obj.cast::<PyUntypedArray>().is_ok() || is_numpy_scalar(obj) {
        let plain = obj
            .call_method0("tolist")
            .map_err(|e| Failure::argument(field(path), e.to_string()))?;
        return to_json_depth(&plain, path, nf, depth + 1);
    }
    Err(Failure::argument(
        field(path),
        format!("cannot be given as {}", type_name(obj)),
    ))
}

fn is_numpy_scalar(obj: &Bound<'_, PyAny>) -> bool {
    obj.get_type()
        .module()
        .ok()
        .and_then(|m| m.to_str().ok().map(|s| s == "numpy"))
        .unwrap_or(false)
        && obj.hasattr("tolist").unwrap_or(false)
}

/// The name of `obj`'s type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Deserialises `value`, naming the failing path (prefixed by `root` when not empty) in a
/// `ParseError`.
pub fn from_json<T: DeserializeOwned>(value: Value, root: &str) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = match (root.is_empty(), path.as_str()) {
            (true, "." | "") => "value".to_string(),
            (false, "." | "") => root.to_string(),
            (true, p) => p.to_string(),
            (false, p) => format!("{root}.{p}"),
        };
        parse_error(&field, &e.into_inner().to_string())
    })
}

/// A `ParseError` naming `field`.
pub fn parse_error(field: &str, reason: &str) -> Failure {
    Failure::new("ParseError", format!("invalid `{field}`: {reason}"))
        .code("parse")
        .field(field)
}

/// A JSON value as a Python object (through the standard `json` module, so that the result is
/// exactly what `json.loads` makes of the CLI's output).
pub fn to_python<'py>(
    py: Python<'py>,
    value: &impl serde::Serialize,
) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| crate::errors::internal(&format!("cannot serialise: {e}")))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// Checks that `obj` is a 1-D, contiguous `float32` numpy array and borrows it read-only
/// (no copy). Errors name `arg`.
pub fn logits_row<'py>(arg: &str, obj: &Bound<'py, PyAny>) -> Result<PyReadonlyArray1<'py, f32>> {
    let untyped = untyped(arg, obj)?;
    if untyped.ndim() != 1 {
        return Err(Failure::argument(
            arg,
            format!(
                "must be one row of logits (a 1-D array), got shape {:?}",
                untyped.shape()
            ),
        ));
    }
    check_dtype(arg, untyped)?;
    let arr = obj
        .cast::<PyArray1<f32>>()
        .map_err(|_| Failure::argument(arg, "must be a 1-D float32 numpy array"))?;
    let ro = arr
        .try_readonly()
        .map_err(|e| Failure::argument(arg, format!("cannot be borrowed: {e}")))?;
    if ro.as_slice().is_err() {
        return Err(Failure::argument(
            arg,
            "must be contiguous, got a strided view (pass numpy.ascontiguousarray(logits))",
        ));
    }
    Ok(ro)
}

/// Checks that `obj` is a 2-D, C-contiguous `float32` numpy array and borrows it read-only.
pub fn logits_rows<'py>(arg: &str, obj: &Bound<'py, PyAny>) -> Result<PyReadonlyArray2<'py, f32>> {
    let untyped = untyped(arg, obj)?;
    if untyped.ndim() != 2 {
        return Err(Failure::argument(
            arg,
            format!(
                "must be a batch of rows (a 2-D array, one row per state), got shape {:?}",
                untyped.shape()
            ),
        ));
    }
    check_dtype(arg, untyped)?;
    if !untyped.is_c_contiguous() {
        return Err(Failure::argument(
            arg,
            "must be C-contiguous (row-major), got a strided or Fortran-ordered view (pass numpy.ascontiguousarray(logits))",
        ));
    }
    let arr = obj
        .cast::<PyArray2<f32>>()
        .map_err(|_| Failure::argument(arg, "must be a 2-D float32 numpy array"))?;
    let ro = arr
        .try_readonly()
        .map_err(|e| Failure::argument(arg, format!("cannot be borrowed: {e}")))?;
    if ro.as_slice().is_err() {
        return Err(Failure::argument(arg, "must be C-contiguous"));
    }
    Ok(ro)
}

fn untyped<'a, 'py>(
    arg: &str,
    obj: &'a Bound<'py, PyAny>,
) -> Result<&'a Bound<'py, PyUntypedArray>> {
    obj.cast::<PyUntypedArray>().map_err(|_| {
        Failure::argument(
            arg,
            format!(
                "must be a numpy.ndarray of float32, got {} (use numpy.asarray(x, dtype=numpy.float32))",
                type_name(obj)
            ),
        )
    })
}

fn check_dtype(arg: &str, arr: &Bound<'_, PyUntypedArray>) -> Result<()> {
    let py = arr.py();
    let dt = arr.dtype();
    if dt.is_equiv_to(&numpy::dtype::<f32>(py)) {
        return Ok(());
    }
    let name = dt
        .str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".into());
    Err(Failure::argument(
        arg,
        format!("must have dtype float32 (native byte order), got {name}; convert with .astype(numpy.float32)"),
    ))
}

/// Token ids from any iterable of integers; errors name `arg[i]`.
pub fn token_ids(arg: &str, obj: &Bound<'_, PyAny>) -> Result<Vec<u32>> {
    if obj.cast::<PyString>().is_ok() || obj.cast::<PyBytes>().is_ok() {
        return Err(Failure::argument(
            arg,
            format!("must be a sequence of token ids, got {}", type_name(obj)),
        ));
    }
    let iter = obj.try_iter().map_err(|_| {
        Failure::argument(
            arg,
            format!("must be a sequence of token ids, got {}", type_name(obj)),
        )
    })?;
    let mut out = Vec::new();
    for (i, item) in iter.enumerate() {
        let item = item.map_err(|e| Failure::argument(arg, e.to_string()))?;
        out.push(token_id(&format!("{arg}[{i}]"), &item)?);
    }
    Ok(out)
}

/// One token id (a non-negative integer below 2^32, numpy integers included).
pub fn token_id(arg: &str, item: &Bound<'_, PyAny>) -> Result<u32> {
    if item.cast::<PyBool>().is_ok() || item.cast::<PyFloat>().is_ok() {
        return Err(Failure::argument(
            arg,
            format!("must be an integer token id, got {}", type_name(item)),
        ));
    }
    let v: i64 = item
        .call_method0("__index__")
        .and_then(|i| i.extract())
        .map_err(|_| {
            Failure::argument(
                arg,
                format!("must be an integer token id, got {}", type_name(item)),
            )
        })?;
    u32::try_from(v).map_err(|_| Failure::argument(arg, format!("{v} is not a token id")))
}

/// An optional non-negative integer argument (`None` when absent or `None`).
pub fn opt_count(arg: &str, obj: Option<&Bound<'_, PyAny>>) -> Result<Option<usize>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => count(arg, o).map(Some),
    }
}

/// A non-negative integer argument (Python or numpy integers; not bools or floats).
pub fn count(arg: &str, o: &Bound<'_, PyAny>) -> Result<usize> {
    if o.cast::<PyBool>().is_ok() || o.cast::<PyFloat>().is_ok() {
        return Err(Failure::argument(
            arg,
            format!("must be an integer, got {}", type_name(o)),
        ));
    }
    let v: i64 = o
        .call_method0("__index__")
        .and_then(|i| i.extract())
        .map_err(|_| Failure::argument(arg, format!("must be an integer, got {}", type_name(o))))?;
    usize::try_from(v).map_err(|_| Failure::argument(arg, format!("{v} is negative")))
}

/// An optional bool argument (only `True` / `False`).
pub fn opt_bool(arg: &str, obj: Option<&Bound<'_, PyAny>>) -> Result<Option<bool>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => o.cast::<PyBool>().map(|b| Some(b.is_true())).map_err(|_| {
            Failure::argument(arg, format!("must be True or False, got {}", type_name(o)))
        }),
    }
}

/// A text argument.
pub fn text(arg: &str, o: &Bound<'_, PyAny>) -> Result<String> {
    o.cast::<PyString>()
        .map_err(|_| Failure::argument(arg, format!("must be a str, got {}", type_name(o))))?
        .to_str()
        .map(str::to_string)
        .map_err(|e| Failure::argument(arg, format!("not valid text: {e}")))
}

/// A file path argument (`str` or `os.PathLike`).
pub fn path(arg: &str, o: &Bound<'_, PyAny>) -> Result<std::path::PathBuf> {
    o.extract::<std::path::PathBuf>().map_err(|_| {
        Failure::argument(
            arg,
            format!("must be a path (str or os.PathLike), got {}", type_name(o)),
        )
    })
}
