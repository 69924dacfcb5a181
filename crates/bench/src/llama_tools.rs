//! llama.cpp's benchmark tools on the CPU, one measurement per call: the peer that
//! `nextok bench engine --llama-cpp` pairs with nextok row by row.
//!
//! The tools come from `bench/peers/llama_cpp.sh`, which builds them into the nextok cache on
//! first use: its `--print-bin-dir` prints the directory holding `llama-bench`,
//! `llama-batched-bench` and `llama-quantize`, its `--print-q8-model` the path of the model's
//! copy re-quantised to Q8_0 by `llama-quantize` (made once, kept in the cache). Each call here
//! runs one tool once (a new process: the model's load is outside the tool's own timing) and
//! returns the tokens/s the tool reports.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The peer script, from the repository root.
const SCRIPT: &str = "bench/peers/llama_cpp.sh";

/// `llama-batched-bench`'s logical and physical batch (as `llama_cpp.sh` runs it).
const BATCH: usize = 512;

/// The built tools and how to run them.
pub(crate) struct LlamaCpp {
    bin: PathBuf,
    threads: usize,
    repack: bool,
    /// `llama-batched-bench` has `--output-format jsonl` (else its markdown table is read).
    batched_jsonl: bool,
    /// Keys and values cached as `q8_0` (`-ctk q8_0 -ctv q8_0`, which llama.cpp runs with
    /// flash attention only: `-fa on`).
    kv_q8_0: bool,
}

/// Runs the peer script with `args`; its standard error goes to ours, and its standard output
/// is one path, returned.
fn script(args: &[&std::ffi::OsStr]) -> Result<PathBuf, String> {
    if !Path::new(SCRIPT).is_file() {
        return Err(format!(
            "--llama-cpp: no {SCRIPT} here: run nextok from the repository root"
        ));
    }
    let what = format!(
        "{SCRIPT} {}",
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = Command::new("bash")
        .arg(SCRIPT)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what} failed ({})", out.status));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| !l.trim().is_empty());
    match line {
        Some(l) => Ok(PathBuf::from(l.trim())),
        None => Err(format!("{what} printed no path")),
    }
}

impl LlamaCpp {
    /// Finds the tools through the peer script (building them on first use). `repack: false`
    /// turns llama.cpp's extra buffer types (weight repacking) off.
    pub(crate) fn locate(threads: usize, repack: bool) -> Result<Self, String> {
        let bin = script(&["--print-bin-dir".as_ref()])?;
        for tool in ["llama-bench", "llama-batched-bench"] {
            if !bin.join(tool).is_file() {
                return Err(format!(
                    "{SCRIPT} --print-bin-dir: no {tool} in {}",
                    bin.display()
                ));
            }
        }
        // (`--help` may exit non-zero: only its text matters)
        let help = Command::new(bin.join("llama-batched-bench"))
            .arg("--help")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("llama-batched-bench --help: {e}"))?;
        let help = String::from_utf8_lossy(&help.stdout) + String::from_utf8_lossy(&help.stderr);
        let batched_jsonl = help
            .lines()
            .any(|l| l.contains("--output-format") && l.contains("jsonl"));
        Ok(LlamaCpp {
            bin,
            threads,
            repack,
            batched_jsonl,
            kv_q8_0: false,
        })
    }

    /// The same tools with the KV cache in `q8_0` (the peer of nextok's `--kv-cache-type
    /// q8_0`).
    pub(crate) fn with_q8_0_cache(mut self, on: bool) -> Self {
        self.kv_q8_0 = on;
        self
    }

    /// The cache-type arguments every tool takes.
    fn cache_args(&self) -> Vec<String> {
        if self.kv_q8_0 {
            ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]
                .map(String::from)
                .to_vec()
        } else {
            Vec::new()
        }
    }

    /// `model`'s copy re-quantised to Q8_0 by `llama-quantize` (the peer of nextok's
    /// `--requant q8_0`), made by the peer script on first use.
    pub(crate) fn q8_0_copy(&self, model: &Path) -> Result<PathBuf, String> {
        let threads = self.threads.to_string();
        let path = script(&[
            "--model".as_ref(),
            model.as_os_str(),
            "--threads".as_ref(),
            threads.as_ref(),
            "--print-q8-model".as_ref(),
        ])?;
        if !path.is_file() {
            return Err(format!(
                "{SCRIPT} --print-q8-model: no file {}",
                path.display()
            ));
        }
        Ok(path)
    }

    /// Runs one tool to completion; its standard output. A failure names the tool, its
    /// arguments and the end of its standard error (a tool killed by a signal with repacking
    /// on suggests `--llama-no-repack`).
    fn tool(&self, name: &str, args: &[String]) -> Result<String, String> {
        let exe = self.bin.join(name);
        let out = Command::new(&exe)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{}: {e}", exe.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let lines: Vec<&str> = err.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            let hint = if out.status.code().is_none() && self.repack {
                "; retry with --llama-no-repack"
            } else {
                ""
            };
            return Err(format!(
                "{name} {} failed ({}){hint}\n{tail}",
                args.join(" "),
                out.status
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// One `llama-bench` repetition of `n_prompt` prompt tokens or `n_gen` generated tokens
    /// (batch 1; one is 0): its tokens/s and the build commit it reports.
    pub(crate) fn bench(
        &self,
        model: &Path,
        n_prompt: usize,
        n_gen: usize,
    ) -> Result<(f64, Option<String>), String> {
        let mut args: Vec<String> = vec![
            "-m".into(),
            model.to_string_lossy().into_owned(),
            "-p".into(),
            n_prompt.to_string(),
            "-n".into(),
            n_gen.to_string(),
            "-r".into(),
            "1".into(),
            "-t".into(),
            self.threads.to_string(),
            "-o".into(),
            "json".into(),
        ];
        if !self.repack {
            args.extend(["--repack".into(), "0".into()]);
        }
        args.extend(self.cache_args());
        let text = self.tool("llama-bench", &args)?;
        parse_bench(&text, n_prompt, n_gen).map_err(|e| format!("llama-bench: {e}"))
    }

    /// One `llama-batched-bench` run of `npl` sequences of `npp` prompt and `ntg` generated
    /// tokens each: its aggregate generation tokens/s (S_TG).
    pub(crate) fn batched(
        &self,
        model: &Path,
        npp: usize,
        ntg: usize,
        npl: usize,
    ) -> Result<f64, String> {
        // each sequence gets its own n_ctx / npl slice of the KV cache, padded to 256 cells
        let ctx = npl * (npp + ntg).div_ceil(256) * 256;
        let mut args: Vec<String> = vec![
            "-m".into(),
            model.to_string_lossy().into_owned(),
            "-c".into(),
            ctx.to_string(),
            "-b".into(),
            BATCH.to_string(),
            "-ub".into(),
            BATCH.to_string(),
            "-npp".into(),
            npp.to_string(),
            "-ntg".into(),
            ntg.to_string(),
            "-npl".into(),
            npl.to_string(),
            "-t".into(),
            self.threads.to_string(),
            "-tb".into(),
            self.threads.to_string(),
        ];
        if self.batched_jsonl {
            args.extend(["--output-format".into(), "jsonl".into()]);
        }
        if !self.repack {
            args.push("--no-repack".into());
        }
        args.extend(self.cache_args());
        let text = self.tool("llama-batched-bench", &args)?;
        parse_batched(&text, npp, ntg, npl).map_err(|e| format!("llama-batched-bench: {e}"))
    }
}

/// `llama-bench -o json`'s row of `n_prompt` / `n_gen`: its `avg_ts` and `build_commit`.
fn parse_bench(text: &str, n_prompt: usize, n_gen: usize) -> Result<(f64, Option<String>), String> {
    let start = text.find('[').ok_or("no JSON array in its output")?;
    let rows: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&text[start..])
        .into_iter()
        .next()
        .ok_or("no JSON array in its output")?
        .map_err(|e| format!("not llama-bench JSON ({e})"))?;
    let row = rows
        .iter()
        .find(|r| {
            r["n_prompt"].as_u64() == Some(n_prompt as u64)
                && r["n_gen"].as_u64() == Some(n_gen as u64)
        })
        .ok_or_else(|| format!("no row of n_prompt {n_prompt}, n_gen {n_gen}"))?;
    let tps = row["avg_ts"].as_f64().ok_or("its row has no avg_ts")?;
    Ok((tps, row["build_commit"].as_str().map(String::from)))
}

/// `llama-batched-bench`'s row of `npl` sequences (JSON lines, or its markdown table
/// `| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |`): S_TG.
fn parse_batched(text: &str, npp: usize, ntg: usize, npl: usize) -> Result<f64, String> {
    for line in text.lines().map(str::trim) {
        if line.starts_with('{') {
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| format!("bad JSON line ({e}): {line}"))?;
            if v["pl"].as_u64() == Some(npl as u64)
                && v["pp"].as_u64() == Some(npp as u64)
                && v["tg"].as_u64() == Some(ntg as u64)
            {
                return v["speed_tg"]
                    .as_f64()
                    .ok_or_else(|| format!("no speed_tg: {line}"));
            }
        } else {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let num = |i: usize| cells[i].parse::<usize>().ok();
            if cells.len() == 10
                && num(0) == Some(npp)
                && num(1) == Some(ntg)
                && num(2) == Some(npl)
            {
                return cells[7]
                    .parse::<f64>()
                    .map_err(|e| format!("S_TG `{}`: {e}", cells[7]));
            }
        }
    }
    Err(format!(
        "no row of {npl} sequences of {npp} prompt + {ntg} generated tokens in its output"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_llama_bench_json() {
        let text = "[\n  {\"build_commit\": \"0c1e570\", \"n_prompt\": 512, \"n_gen\": 0, \"avg_ts\": 232.8}\n]\n";
        let (tps, commit) = parse_bench(text, 512, 0).unwrap();
        assert_eq!(tps, 232.8);
        assert_eq!(commit.as_deref(), Some("0c1e570"));
        assert!(parse_bench(text, 0, 128).is_err());
    }

    #[test]
    fn reads_llama_batched_bench_jsonl_and_table() {
        let jsonl =
            "{\"pp\": 20, \"tg\": 128, \"pl\": 16, \"speed_pp\": 246.6, \"speed_tg\": 83.75}\n";
        assert_eq!(parse_batched(jsonl, 20, 128, 16).unwrap(), 83.75);
        let md = "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n\
                  |-------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n\
                  |    20 |    128 |   16 |   2368 |    1.297 |   246.65 |   24.453 |    83.75 |   25.750 |    91.96 |\n";
        assert_eq!(parse_batched(md, 20, 128, 16).unwrap(), 83.75);
        assert!(parse_batched(md, 20, 128, 4).is_err());
    }
}
