//! `nextok vocab` and `nextok tokenize`: a vocabulary's facts and the exact bytes of tokens.
//!
//! * `nextok vocab --tokenizer tokenizer.json` (or `--model FILE.gguf`) prints the vocabulary
//!   size, EOS, BOS and special ids; `--id N...` prints the exact bytes of those tokens (hex and
//!   escaped); `--json` prints one JSON object instead.
//! * `nextok tokenize --tokenizer tokenizer.json --text T` prints the ids of `T` and each
//!   token's bytes. With `--model FILE.gguf` the tokenizer is rebuilt from the GGUF metadata
//!   (byte-level BPE vocabularies).
//!
//! Bad input (a missing file, a malformed field, an id out of range) is one line naming the
//! problem, and exit status 2.

use nextok_vocab::display::{escape, hex, hex_compact};
use nextok_vocab::encode::Encoder;
use nextok_vocab::gguf::Gguf;
use nextok_vocab::{ByteEncoding, LoadOptions, SequenceStrip, Vocabulary};
use serde_json::{json, Value};

use crate::error::CliError;

/// Where the vocabulary comes from, and the caller's overrides.
#[derive(clap::Args)]
pub struct SourceArgs {
    /// A Hugging Face tokenizer.json.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<String>,
    /// A GGUF model file (only its metadata is read), or a model name (`gemma-3-270m`,
    /// `smollm2-135m-instruct`) fetched once into the cache.
    #[arg(long, value_name = "FILE.gguf")]
    pub model: Option<String>,
    /// EOS ids to use instead of the derived ones (repeat the flag or separate by commas).
    #[arg(long = "eos-id", value_name = "ID", value_delimiter = ',')]
    pub eos_id: Vec<String>,
    /// The model's logits size, when larger than the tokenizer's vocabulary (the extra ids
    /// become special padding tokens with no bytes).
    #[arg(long, value_name = "N")]
    pub vocab_size: Option<String>,
}

/// Arguments of `nextok vocab`.
#[derive(clap::Args)]
pub struct VocabArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// Token ids whose exact bytes to print.
    #[arg(long = "id", value_name = "N", num_args = 1.., value_delimiter = ',')]
    pub ids: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `nextok tokenize`.
#[derive(clap::Args)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The text to tokenize.
    #[arg(long, value_name = "T")]
    pub text: String,
    /// Let the tokenizer add its special tokens (a BOS token, typically).
    #[arg(long)]
    pub add_special_tokens: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

enum Source<'a> {
    Json(&'a str),
    Gguf(&'a str),
}

impl SourceArgs {
    fn source(&self) -> Result<Source<'_>, CliError> {
        match (&self.tokenizer, &self.model) {
            (Some(t), None) => Ok(Source::Json(t)),
            (None, Some(m)) => Ok(Source::Gguf(m)),
            (Some(_), Some(_)) => Err("give either --tokenizer or --model, not both".into()),
            (None, None) => {
                Err("give --tokenizer FILE (tokenizer.json) or --model FILE.gguf".into())
            }
        }
    }

    fn options(&self) -> Result<LoadOptions, CliError> {
        let eos = if self.eos_id.is_empty() {
            None
        } else {
            let mut v = Vec::new();
            for s in &self.eos_id {
                v.push(parse_id("--eos-id", s)?);
            }
            Some(v)
        };
        let vocab_size = match &self.vocab_size {
            None => None,
            Some(s) => Some(
                s.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("--vocab-size {s:?}: expected a positive integer"))?,
            ),
        };
        Ok(LoadOptions {
            eos_token_ids: eos,
            vocab_size,
        })
    }

    fn load(&self) -> Result<(Vocabulary, String, Option<Gguf>), CliError> {
        let opts = self.options()?;
        match self.source()? {
            Source::Json(p) => {
                let v = Vocabulary::from_tokenizer_json_file(p, &opts)?;
                Ok((v, p.to_string(), None))
            }
            Source::Gguf(p) => {
                // a path, or a model name fetched once (`--model gemma-3-270m`)
                let path = nextok_model::model_path(Some(std::path::Path::new(p)))?;
                let label = path.display().to_string();
                let g = Gguf::read_file(&path)?;
                let v = Vocabulary::from_gguf(&g, &label, &opts)?;
                Ok((v, label, Some(g)))
            }
        }
    }
}

fn parse_id(flag: &str, s: &str) -> Result<u32, CliError> {
    s.trim()
        .parse::<u32>()
        .map_err(|_| format!("{flag} {s:?}: expected a token id (a non-negative integer)").into())
}

fn check_id(v: &Vocabulary, flag: &str, id: u32) -> Result<(), CliError> {
    if (id as usize) < v.len() {
        Ok(())
    } else {
        Err(format!(
            "{flag} {id}: token id out of range (the vocabulary has {} tokens, ids 0 to {})",
            v.len(),
            v.len() - 1
        )
        .into())
    }
}

fn encoding_name(e: ByteEncoding) -> &'static str {
    match e {
        ByteEncoding::ByteLevel => "byte-level BPE (GPT-2 byte map)",
        ByteEncoding::SentencePiece => {
            "SentencePiece style (\u{2581} is a space, <0xNN> byte tokens)"
        }
        ByteEncoding::Plain => "plain text tokens",
    }
}

fn strip_note(s: Option<SequenceStrip>) -> Option<String> {
    match s? {
        SequenceStrip::Strip {
            content,
            start,
            stop,
        } => Some(format!(
            "the decoder strips up to {start} leading and {stop} trailing {content:?} of a whole text (token bytes keep them)"
        )),
        SequenceStrip::MetaspaceFirstToken => Some(
            "the decoder drops the first token's leading space of a whole text (token bytes keep it)"
                .into(),
        ),
    }
}

fn token_json(v: &Vocabulary, id: u32) -> Value {
    let b = v.token(id).unwrap_or(&[]);
    json!({
        "id": id,
        "kind": v.kind(id).map(|k| k.name()),
        "name": v.name(id),
        "bytes_hex": hex_compact(b),
        "text": escape(b),
        "utf8": std::str::from_utf8(b).is_ok(),
    })
}

fn token_line(v: &Vocabulary, id: u32) -> String {
    let b = v.token(id).unwrap_or(&[]);
    format!(
        "{id:>8}  {:<12}  {:>2} bytes  [{}]  \"{}\"  name {:?}",
        v.kind(id).map_or("", |k| k.name()),
        b.len(),
        hex(b),
        escape(b),
        v.name(id).unwrap_or("")
    )
}

fn named(v: &Vocabulary, ids: &[u32]) -> String {
    if ids.is_empty() {
        return "none".into();
    }
    ids.iter()
        .map(|&i| format!("{i} {}", v.name(i).unwrap_or("")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How many special tokens the text output lists before eliding the rest.
const SPECIAL_SHOWN: usize = 24;

/// Runs `nextok vocab`.
pub fn run_vocab(args: VocabArgs) -> Result<(), CliError> {
    let (v, path, _) = args.source.load()?;
    let mut ids = Vec::new();
    for s in &args.ids {
        let id = parse_id("--id", s)?;
        check_id(&v, "--id", id)?;
        ids.push(id);
    }
    let partial = v.partial_utf8_ids().len();
    if args.json {
        let out = json!({
            "source": path,
            "format": v.format,
            "vocab_size": v.len(),
            "byte_encoding": v.byte_encoding,
            "sequence_strip": v.sequence_strip,
            "eos_token_ids": v.info.eos_token_ids,
            "bos_token_id": v.bos,
            "special_token_ids": v.info.special_token_ids,
            "special_tokens": v.info.special_token_ids.iter().map(|&i| json!({
                "id": i, "name": v.name(i), "kind": v.kind(i).map(|k| k.name())
            })).collect::<Vec<_>>(),
            "partial_utf8_tokens": partial,
            "bytes_sha256": v.bytes_digest(),
            "tokens": ids.iter().map(|&i| token_json(&v, i)).collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let sp = &v.info.special_token_ids;
    outln!("source        {path}");
    outln!("tokens        {}", v.len());
    outln!("encoding      {}", encoding_name(v.byte_encoding));
    outln!("eos           {}", named(&v, &v.info.eos_token_ids));
    outln!(
        "bos           {}",
        v.bos.map_or("none".to_string(), |b| named(&v, &[b]))
    );
    let shown = &sp[..sp.len().min(SPECIAL_SHOWN)];
    let more = if sp.len() > shown.len() {
        format!(", … and {} more (--json lists all)", sp.len() - shown.len())
    } else {
        String::new()
    };
    outln!("special       {}: {}{more}", sp.len(), named(&v, shown));
    outln!("partial UTF-8 {partial} tokens are not valid UTF-8 on their own");
    if let Some(n) = strip_note(v.sequence_strip) {
        outln!("sequence rule {n}");
    }
    outln!("bytes sha256  {}", v.bytes_digest());
    if !ids.is_empty() {
        outln!();
        for &id in &ids {
            outln!("{}", token_line(&v, id));
        }
    }
    Ok(())
}

/// Runs `nextok tokenize`.
pub fn run_tokenize(args: TokenizeArgs) -> Result<(), CliError> {
    let (v, path, g) = args.source.load()?;
    let enc = match &g {
        Some(g) => Encoder::from_gguf(g, &path),
        None => Encoder::from_tokenizer_json_file(&path),
    }?;
    let ids = enc.encode(&args.text, args.add_special_tokens)?;
    for (i, &id) in ids.iter().enumerate() {
        check_id(&v, &format!("token {i} of the encoding:"), id)?;
    }
    let text_bytes = v.decode_text(&ids)?;
    let exact = text_bytes == args.text.as_bytes();
    if args.json {
        let out = json!({
            "source": path,
            "ids": ids,
            "tokens": ids.iter().map(|&i| token_json(&v, i)).collect::<Vec<_>>(),
            "bytes_hex": hex_compact(&v.decode(&ids)?),
            "round_trip": exact,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    outln!(
        "{} tokens: {}",
        ids.len(),
        ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
    );
    for &id in &ids {
        outln!("{}", token_line(&v, id));
    }
    if exact {
        outln!("the token bytes spell the text exactly");
    } else {
        outln!(
            "the token bytes spell \"{}\", not the text (special tokens added, or characters the vocabulary cannot spell)",
            escape(&text_bytes)
        );
    }
    Ok(())
}
