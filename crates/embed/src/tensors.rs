//! A `.safetensors` file's `F32` tensors: an 8-byte little-endian header
//! length, a JSON header naming each tensor's dtype, shape and byte range,
//! then the data.

use std::collections::HashMap;

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("not a safetensors file: {0}")]
    Format(String),
    #[error("the model has no tensor {0}")]
    Missing(String),
    #[error("tensor {name} has shape {found:?}, the model's configuration wants {wanted:?}")]
    Shape {
        name: String,
        found: Vec<usize>,
        wanted: Vec<usize>,
    },
    #[error("tensor {name} is {dtype}; only F32 models are read")]
    Dtype { name: String, dtype: String },
}

#[derive(Deserialize)]
struct Entry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

pub struct Tensors {
    bytes: Vec<u8>,
    start: usize,
    entries: HashMap<String, Entry>,
}

impl Tensors {
    pub fn parse(bytes: Vec<u8>) -> Result<Tensors, TensorError> {
        let format = |why: &str| TensorError::Format(why.to_string());
        let length: [u8; 8] = (bytes.get(..8))
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| format("shorter than its header"))?;
        let length = usize::try_from(u64::from_le_bytes(length))
            .map_err(|_| format("header length out of range"))?;
        let start = 8usize
            .checked_add(length)
            .filter(|end| *end <= bytes.len())
            .ok_or_else(|| format("header longer than the file"))?;
        let header: HashMap<String, serde_json::Value> =
            serde_json::from_slice(&bytes[8..start])
                .map_err(|e| TensorError::Format(format!("header: {e}")))?;
        let mut entries = HashMap::new();
        for (name, value) in header {
            if name == "__metadata__" {
                continue;
            }
            let entry: Entry = serde_json::from_value(value)
                .map_err(|e| TensorError::Format(format!("tensor {name}: {e}")))?;
            let [from, to] = entry.data_offsets;
            if from > to || start.checked_add(to).is_none_or(|end| end > bytes.len()) {
                return Err(TensorError::Format(format!(
                    "tensor {name}'s data lies outside the file"
                )));
            }
            entries.insert(name, entry);
        }
        Ok(Tensors {
            bytes,
            start,
            entries,
        })
    }

    /// Whether the file holds tensor `name`.
    pub fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Tensor `name`'s values, which must have `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, TensorError> {
        let entry = (self.entries.get(name)).ok_or_else(|| TensorError::Missing(name.into()))?;
        if entry.dtype != "F32" {
            return Err(TensorError::Dtype {
                name: name.into(),
                dtype: entry.dtype.clone(),
            });
        }
        let [from, to] = entry.data_offsets;
        let count: usize = shape.iter().product();
        if entry.shape != shape || to - from != count * 4 {
            return Err(TensorError::Shape {
                name: name.into(),
                found: entry.shape.clone(),
                wanted: shape.to_vec(),
            });
        }
        let data = &self.bytes[self.start + from..self.start + to];
        Ok(data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[f32]) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        for v in data {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        bytes
    }

    #[test]
    fn tensors_are_read_by_name_and_shape() {
        let header = r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"h":{"dtype":"F16","shape":[1],"data_offsets":[16,18]}}"#;
        let mut bytes = file(header, &[1.0, 2.0, 3.0, 4.5]);
        bytes.extend_from_slice(&[0, 0]);
        let t = Tensors::parse(bytes).unwrap();
        assert_eq!(t.get("w", &[2, 2]).unwrap(), [1.0, 2.0, 3.0, 4.5]);
        let wrong = t.get("w", &[4]).err().unwrap().to_string();
        assert_eq!(
            wrong,
            "tensor w has shape [2, 2], the model's configuration wants [4]"
        );
        assert!(matches!(t.get("h", &[1]), Err(TensorError::Dtype { .. })));
        assert!(matches!(t.get("x", &[1]), Err(TensorError::Missing(_))));
    }

    #[test]
    fn a_truncated_file_is_refused() {
        let header = r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let bytes = file(header, &[1.0]);
        let e = Tensors::parse(bytes).err().unwrap().to_string();
        assert_eq!(
            e,
            "not a safetensors file: tensor w's data lies outside the file"
        );
        assert!(Tensors::parse(vec![1, 2]).is_err());
        let huge = file("{}", &[]);
        let mut huge = huge;
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Tensors::parse(huge).is_err());
    }
}
