//! Models by HuggingFace Hub name: `org/name`, `org/name@revision`, `org/name:QUANT` (a GGUF file of a
//! GGUF repository), downloaded into the standard Hub cache that transformers and vLLM share.
//!
//! [`resolve`] turns what a user passes as `--model` into a local path: an existing folder or file
//! as it is, else a Hub id whose files are fetched with the `hf-hub` crate (resumable `.part`
//! downloads, ETag-named blobs under `models--org--name/`, a progress bar) and then checked — a
//! blob whose ETag is a SHA-256 (every LFS file: the weights) must hash to it. With `offline` set
//! (`HF_HUB_OFFLINE=1`) nothing is fetched: the cached snapshot is used or the error says what is
//! missing.

use std::io::Read;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{ApiBuilder, ApiError};
use hf_hub::{Repo, RepoType};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// Where and how to reach the Hub.
#[derive(Debug, Clone)]
pub struct HubOptions {
    /// `https://huggingface.co`, or a mirror (`HF_ENDPOINT`).
    pub endpoint: String,
    /// The cache's `hub` folder (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// Sent as `Authorization: Bearer` (`HF_TOKEN`, else the token file next to the cache).
    pub token: Option<String>,
    /// Use the cache only (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// Draw a progress bar per file.
    pub progress: bool,
}

impl HubOptions {
    /// The options huggingface_hub reads from the environment: `HF_ENDPOINT`, `HF_HUB_CACHE`,
    /// `HF_HOME`, `HF_TOKEN`, `HF_HUB_OFFLINE`.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let home = var("HF_HOME").map(PathBuf::from).unwrap_or_else(|| {
            let base = var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"));
            base.join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join("hub"));
        let token = var("HF_TOKEN").or_else(|| {
            std::fs::read_to_string(home.join("token"))
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
        });
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on")
        });
        Self {
            endpoint: var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into()),
            cache_dir,
            token,
            offline,
            progress: true,
        }
    }
}

/// A Hub model reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    /// `org/name`.
    pub repo: String,
    /// A branch, tag or commit (default `main`).
    pub revision: String,
    /// Which GGUF file of the repository, if one is asked for.
    pub gguf: Option<GgufPick>,
}

/// How a GGUF file of a repository is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GgufPick {
    /// Exactly this file (`--gguf-file NAME`).
    File(String),
    /// The one `.gguf` file whose name contains this tag, any case (`org/name:Q4_K_M`).
    Tag(String),
}

/// Why a model could not be resolved.
#[derive(Debug, Error)]
pub enum HubError {
    #[error(
        "{0:?} is neither a local folder or file nor a Hub id (org/name, org/name@revision, org/name:QUANT)"
    )]
    NotAModel(String),
    #[error("{repo}: not found on {endpoint} (no such repository or revision, or it is private)")]
    NotFound { repo: String, endpoint: String },
    #[error(
        "{repo}: {endpoint} refused access ({status}); set HF_TOKEN to a token that may read it"
    )]
    Unauthorized {
        repo: String,
        endpoint: String,
        status: u16,
    },
    #[error("{repo}: HF_HUB_OFFLINE is set and the cache ({cache}) lacks {what}")]
    NotCached {
        repo: String,
        cache: PathBuf,
        what: String,
    },
    #[error("{repo}: no model in it: {reason}")]
    NoModel { repo: String, reason: String },
    #[error("{repo}: {reason}; its GGUF files: {candidates:?}")]
    GgufChoice {
        repo: String,
        reason: String,
        candidates: Vec<String>,
    },
    #[error("{repo}/{file}: downloaded bytes hash to {actual}, the Hub says {expected}")]
    Checksum {
        repo: String,
        file: String,
        expected: String,
        actual: String,
    },
    #[error("{repo}: {message}")]
    Request { repo: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Parses `org/name`, `org/name@revision`, `org/name:TAG` (and `org/name@revision:TAG`); `None`
/// for anything else. `gguf_file` (`--gguf-file`) picks a file by name and wins over a tag.
pub fn parse_model_ref(s: &str, gguf_file: Option<&str>) -> Option<ModelRef> {
    let (rest, tag) = match s.rsplit_once(':') {
        Some((r, t)) if !t.is_empty() && !t.contains('/') => (r, Some(t)),
        _ => (s, None),
    };
    let (repo, revision) = match rest.split_once('@') {
        Some((r, rev)) if !rev.is_empty() => (r, rev),
        Some(_) => return None,
        None => (rest, "main"),
    };
    let (org, name) = repo.split_once('/')?;
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.len() <= 96
            && !p.starts_with(['.', '-'])
            && !p.contains("..")
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    };
    let rev_ok = revision.len() <= 256
        && !revision.contains("..")
        && revision
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
    if !(part_ok(org) && part_ok(name) && rev_ok) {
        return None;
    }
    let gguf = match (gguf_file, tag) {
        (Some(f), _) => Some(GgufPick::File(f.to_owned())),
        (None, Some(t)) => Some(GgufPick::Tag(t.to_owned())),
        (None, None) => None,
    };
    Some(ModelRef {
        repo: repo.to_owned(),
        revision: revision.to_owned(),
        gguf,
    })
}

/// A local path for `model`: itself when it exists, else the Hub model it names, fetched (or,
/// offline, found) in the cache — the snapshot folder, or the chosen `.gguf` file in it.
pub fn resolve(
    model: &str,
    gguf_file: Option<&str>,
    opts: &HubOptions,
) -> Result<PathBuf, HubError> {
    let local = Path::new(model);
    if local.exists() {
        return Ok(match gguf_file {
            Some(f) if local.is_dir() => local.join(f),
            _ => local.to_path_buf(),
        });
    }
    let r = parse_model_ref(model, gguf_file).ok_or_else(|| HubError::NotAModel(model.into()))?;
    if opts.offline {
        resolve_offline(&r, opts)
    } else {
        resolve_online(&r, opts)
    }
}

/// Files of a safetensors model worth fetching (those present of these).
const CONFIG_FILES: [&str; 5] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

/// Which files of `files` make the model `r` asks for.
fn pick_files(r: &ModelRef, files: &[String]) -> Result<Vec<String>, HubError> {
    let ggufs: Vec<String> = files
        .iter()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf"))
        .cloned()
        .collect();
    let choice = |reason: String| HubError::GgufChoice {
        repo: r.repo.clone(),
        reason,
        candidates: ggufs.clone(),
    };
    match &r.gguf {
        Some(GgufPick::File(f)) => {
            if files.contains(f) {
                Ok(vec![f.clone()])
            } else {
                Err(choice(format!("it has no file {f:?}")))
            }
        }
        Some(GgufPick::Tag(tag)) => {
            let t = tag.to_ascii_lowercase();
            let hits: Vec<&String> = ggufs
                .iter()
                .filter(|f| f.to_ascii_lowercase().contains(&t))
                .collect();
            match hits.as_slice() {
                [one] => Ok(vec![(*one).clone()]),
                [] => Err(choice(format!("no GGUF file's name contains {tag:?}"))),
                _ => Err(choice(format!(
                    "{} GGUF files match {tag:?}; name one with --gguf-file",
                    hits.len()
                ))),
            }
        }
        None => {
            if files.iter().any(|f| f == "config.json") {
                let mut out: Vec<String> = CONFIG_FILES
                    .iter()
                    .filter(|c| files.iter().any(|f| f == *c))
                    .map(|c| (*c).to_owned())
                    .collect();
                if files.iter().any(|f| f == "model.safetensors") {
                    out.push("model.safetensors".into());
                } else if files.iter().any(|f| f == "model.safetensors.index.json") {
                    out.push("model.safetensors.index.json".into());
                } else {
                    return Err(HubError::NoModel {
                        repo: r.repo.clone(),
                        reason: "config.json but neither model.safetensors nor \
                                 model.safetensors.index.json"
                            .into(),
                    });
                }
                Ok(out)
            } else if let [one] = ggufs.as_slice() {
                Ok(vec![one.clone()])
            } else if ggufs.is_empty() {
                Err(HubError::NoModel {
                    repo: r.repo.clone(),
                    reason: "neither config.json nor a .gguf file".into(),
                })
            } else {
                Err(choice(
                    "it holds several GGUF files; pick one with org/name:QUANT or --gguf-file"
                        .into(),
                ))
            }
        }
    }
}

/// The shard files a `model.safetensors.index.json` lists.
fn index_shards(repo: &str, index: &Path) -> Result<Vec<String>, HubError> {
    let text = std::fs::read_to_string(index).map_err(|source| HubError::Io {
        path: index.to_path_buf(),
        source,
    })?;
    let bad = |reason: &str| HubError::NoModel {
        repo: repo.into(),
        reason: format!("model.safetensors.index.json: {reason}"),
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no weight_map"))?;
    let mut shards: Vec<String> = Vec::new();
    for shard in map.values() {
        let s = shard
            .as_str()
            .ok_or_else(|| bad("a shard is not a file name"))?;
        if s.contains('/') || s.contains("..") {
            return Err(bad(&format!("shard {s:?} is not a plain file name")));
        }
        if !shards.iter().any(|x| x == s) {
            shards.push(s.to_owned());
        }
    }
    shards.sort();
    Ok(shards)
}

fn request_error(r: &ModelRef, opts: &HubOptions, e: ApiError) -> HubError {
    match status_of(&e) {
        Some(status @ (401 | 403)) => HubError::Unauthorized {
            repo: r.repo.clone(),
            endpoint: opts.endpoint.clone(),
            status,
        },
        Some(404) => HubError::NotFound {
            repo: format!("{}@{}", r.repo, r.revision),
            endpoint: opts.endpoint.clone(),
        },
        _ => HubError::Request {
            repo: r.repo.clone(),
            message: e.to_string(),
        },
    }
}

fn status_of(e: &ApiError) -> Option<u16> {
    match e {
        ApiError::RequestError(boxed) => match boxed.as_ref() {
            ureq::Error::Status(code, _) => Some(*code),
            ureq::Error::Transport(_) => None,
        },
        _ => None,
    }
}

fn resolve_online(r: &ModelRef, opts: &HubOptions) -> Result<PathBuf, HubError> {
    let api = ApiBuilder::new()
        .with_endpoint(opts.endpoint.clone())
        .with_cache_dir(opts.cache_dir.clone())
        .with_token(opts.token.clone())
        .with_progress(opts.progress)
        .with_retries(3)
        .build()
        .map_err(|e| request_error(r, opts, e))?;
    let repo = api.repo(Repo::with_revision(
        r.repo.clone(),
        RepoType::Model,
        r.revision.clone(),
    ));
    let info = repo.info().map_err(|e| request_error(r, opts, e))?;
    let files: Vec<String> = info.siblings.into_iter().map(|s| s.rfilename).collect();
    let mut wanted = pick_files(r, &files)?;
    let mut fetched = Vec::new();
    let mut i = 0;
    while i < wanted.len() {
        let file = wanted[i].clone();
        let path = repo.get(&file).map_err(|e| request_error(r, opts, e))?;
        verify_blob(r, &file, &path)?;
        if file == "model.safetensors.index.json" {
            for shard in index_shards(&r.repo, &path)? {
                if !files.contains(&shard) {
                    return Err(HubError::NoModel {
                        repo: r.repo.clone(),
                        reason: format!("the index lists {shard:?}, which the repository lacks"),
                    });
                }
                wanted.push(shard);
            }
        }
        fetched.push(path);
        i += 1;
    }
    model_path(r, &fetched[0])
}

/// The folder (safetensors) or file (GGUF) the engine opens, given the first file fetched.
fn model_path(r: &ModelRef, first: &Path) -> Result<PathBuf, HubError> {
    if first
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return Ok(first.to_path_buf());
    }
    first
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| HubError::NoModel {
            repo: r.repo.clone(),
            reason: format!("{} has no folder", first.display()),
        })
}

/// Checks an LFS blob (its ETag, the blob's file name, is a SHA-256) against its bytes.
fn verify_blob(r: &ModelRef, file: &str, path: &Path) -> Result<(), HubError> {
    let io = |source| HubError::Io {
        path: path.to_path_buf(),
        source,
    };
    let blob = std::fs::canonicalize(path).map_err(io)?;
    let Some(expected) = blob.file_name().and_then(|n| n.to_str()) else {
        return Ok(());
    };
    let is_sha256 = expected.len() == 64 && expected.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_sha256 {
        return Ok(()); // a git blob id (small files): nothing to hash against
    }
    let mut f = std::fs::File::open(&blob).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let actual: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if actual != expected.to_ascii_lowercase() {
        // A corrupt blob must not be found by the next run's cache lookup.
        let _ = std::fs::remove_file(&blob);
        return Err(HubError::Checksum {
            repo: r.repo.clone(),
            file: file.to_owned(),
            expected: expected.to_owned(),
            actual,
        });
    }
    Ok(())
}

/// The cached snapshot of `r`: `models--org--name/snapshots/<commit>/`, the commit read from
/// `refs/<revision>` (or the revision itself, when it is a commit).
fn resolve_offline(r: &ModelRef, opts: &HubOptions) -> Result<PathBuf, HubError> {
    let not_cached = |what: String| HubError::NotCached {
        repo: r.repo.clone(),
        cache: opts.cache_dir.clone(),
        what,
    };
    let root = opts
        .cache_dir
        .join(format!("models--{}", r.repo.replace('/', "--")));
    let commit = match std::fs::read_to_string(root.join("refs").join(&r.revision)) {
        Ok(c) => c.trim().to_owned(),
        Err(_) if root.join("snapshots").join(&r.revision).is_dir() => r.revision.clone(),
        Err(_) => return Err(not_cached(format!("revision {:?}", r.revision))),
    };
    let snapshot = root.join("snapshots").join(&commit);
    let mut files = Vec::new();
    let entries =
        std::fs::read_dir(&snapshot).map_err(|_| not_cached(format!("the snapshot {commit}")))?;
    for e in entries.flatten() {
        if let Some(name) = e.file_name().to_str() {
            files.push(name.to_owned());
        }
    }
    files.sort();
    let mut wanted = pick_files(r, &files)?;
    if wanted.iter().any(|f| f == "model.safetensors.index.json") {
        wanted.extend(index_shards(
            &r.repo,
            &snapshot.join("model.safetensors.index.json"),
        )?);
    }
    for f in &wanted {
        if !snapshot.join(f).is_file() {
            return Err(not_cached(format!("{f} of snapshot {commit}")));
        }
    }
    model_path(r, &snapshot.join(&wanted[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_refs_parse_and_paths_do_not() {
        let r = parse_model_ref("HuggingFaceTB/SmolLM2-135M-Instruct", None).unwrap();
        assert_eq!(r.repo, "HuggingFaceTB/SmolLM2-135M-Instruct");
        assert_eq!(r.revision, "main");
        assert_eq!(r.gguf, None);
        let r = parse_model_ref("org/name@v1.0:Q4_K_M", None).unwrap();
        assert_eq!(
            (r.revision.as_str(), r.gguf),
            ("v1.0", Some(GgufPick::Tag("Q4_K_M".into())))
        );
        let r = parse_model_ref("org/name:Q8_0", Some("exact.gguf")).unwrap();
        assert_eq!(r.gguf, Some(GgufPick::File("exact.gguf".into())));
        for bad in [
            "name",
            "/abs/path",
            "./rel/path",
            "org/na me",
            "org/../x",
            "a/b/c",
            "org/name@",
            "../x/y",
            "org/.hidden",
        ] {
            assert_eq!(parse_model_ref(bad, None), None, "{bad}");
        }
    }

    #[test]
    fn gguf_files_are_picked_by_tag_or_refused_with_the_choices() {
        let files: Vec<String> = ["README.md", "m.Q4_K_M.gguf", "m.Q8_0.gguf", "m.q4_k_s.gguf"]
            .map(String::from)
            .to_vec();
        let r = |s: &str| parse_model_ref(s, None).unwrap();
        assert_eq!(pick_files(&r("o/m:q8_0"), &files).unwrap(), ["m.Q8_0.gguf"]);
        let e = pick_files(&r("o/m:Q4_K"), &files).unwrap_err();
        assert!(e.to_string().contains("2 GGUF files match"), "{e}");
        let e = pick_files(&r("o/m"), &files).unwrap_err();
        assert!(e.to_string().contains("several GGUF files"), "{e}");
        let e = pick_files(&r("o/m:IQ2"), &files).unwrap_err();
        assert!(e.to_string().contains("m.Q8_0.gguf"), "{e}");
        let st: Vec<String> = [
            "config.json",
            "tokenizer.json",
            "model.safetensors",
            "x.bin",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            pick_files(&r("o/m"), &st).unwrap(),
            ["config.json", "tokenizer.json", "model.safetensors"]
        );
    }
}
