//! Just enough of GGUF to read a model's metadata (no tensors): the key/value section.
//! Spec: ggml's docs/gguf.md (version 2 and 3 headers, little-endian).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    /// Arrays of numbers are kept (per-layer head counts); others only by length.
    Array(Vec<Value>),
}

impl Value {
    /// A count or a flag as llama.cpp's loader reads it into an integer (bools are 0/1).
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(v) => u64::try_from(*v).ok(),
            Value::Bool(b) => Some(*b as u64),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} is not a GGUF file (bad magic)")]
    Magic(String),
    #[error("{path}: unsupported GGUF version {version}")]
    Version { path: String, version: u32 },
    #[error("{path}: malformed metadata ({what})")]
    Malformed { path: String, what: String },
}

pub struct Metadata(pub BTreeMap<String, Value>);

struct Reader<R> {
    r: R,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b)?;
        Ok(b)
    }
    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self, limit: u64) -> Result<String, String> {
        let n = self.u64().map_err(|e| e.to_string())?;
        if n > limit {
            return Err(format!("string of {n} bytes"));
        }
        let mut b = vec![0u8; n as usize];
        self.r.read_exact(&mut b).map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    fn value(&mut self, ty: u32, depth: u32) -> Result<Value, String> {
        let io = |e: std::io::Error| e.to_string();
        Ok(match ty {
            0 => Value::Int(u8::from_le_bytes(self.bytes().map_err(io)?) as i64),
            1 => Value::Int(i8::from_le_bytes(self.bytes().map_err(io)?) as i64),
            2 => Value::Int(u16::from_le_bytes(self.bytes().map_err(io)?) as i64),
            3 => Value::Int(i16::from_le_bytes(self.bytes().map_err(io)?) as i64),
            4 => Value::Int(self.u32().map_err(io)? as i64),
            5 => Value::Int(i32::from_le_bytes(self.bytes().map_err(io)?) as i64),
            6 => Value::Float(f32::from_le_bytes(self.bytes().map_err(io)?) as f64),
            7 => Value::Bool(self.bytes::<1>().map_err(io)?[0] != 0),
            8 => Value::Str(self.string(1 << 24)?),
            9 => {
                if depth > 2 {
                    return Err("nested arrays".into());
                }
                let ety = self.u32().map_err(io)?;
                let n = self.u64().map_err(io)?;
                if n > 1 << 28 {
                    return Err(format!("array of {n} items"));
                }
                let mut v = Vec::new();
                for _ in 0..n {
                    let x = self.value(ety, depth + 1)?;
                    // Keep numeric arrays (per-layer values); drop big string arrays (vocab).
                    if matches!(x, Value::Int(_) | Value::Float(_) | Value::Bool(_)) {
                        v.push(x);
                    }
                }
                Value::Array(v)
            }
            10 => Value::Int(self.u64().map_err(io)? as i64),
            11 => Value::Int(i64::from_le_bytes(self.bytes().map_err(io)?)),
            12 => Value::Float(f64::from_le_bytes(self.bytes().map_err(io)?)),
            t => return Err(format!("unknown value type {t}")),
        })
    }
}

impl Metadata {
    pub fn read(path: &Path) -> Result<Metadata, GgufError> {
        let p = path.display().to_string();
        let io = |source| GgufError::Io {
            path: p.clone(),
            source,
        };
        let bad = |what: String| GgufError::Malformed {
            path: p.clone(),
            what,
        };
        let mut r = Reader {
            r: BufReader::new(File::open(path).map_err(io)?),
        };
        if &r.bytes::<4>().map_err(io)? != b"GGUF" {
            return Err(GgufError::Magic(p.clone()));
        }
        let version = r.u32().map_err(io)?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: p.clone(),
                version,
            });
        }
        let _n_tensors = r.u64().map_err(io)?;
        let n_kv = r.u64().map_err(io)?;
        if n_kv > 1 << 20 {
            return Err(bad(format!("{n_kv} metadata entries")));
        }
        let mut map = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string(1 << 16).map_err(&bad)?;
            let ty = r.u32().map_err(io)?;
            let v = r.value(ty, 0).map_err(|e| bad(format!("{key}: {e}")))?;
            map.insert(key, v);
        }
        Ok(Metadata(map))
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key)
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        match self.get(key) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }
}
