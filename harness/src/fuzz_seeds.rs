//! The fuzz targets' seeds as ordinary tests: each crate with a `fuzz/` directory has a
//! `tests/fuzz_seeds.rs` that compiles its cargo-fuzz targets as modules and hands each target's
//! `run` to [`replay`], so every suite run puts the seeds (and a local corpus, if `scripts/fuzz`
//! grew one) through the parsers, without libFuzzer, sanitizers or a nightly toolchain. Real
//! fuzzing stays with `scripts/fuzz`.

use std::path::{Path, PathBuf};

/// Why the seeds of a target cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// The target has no seeds (they are kept in git, one directory per target).
    #[error(
        "no seeds in {0}: each fuzz target keeps its seeds in git (<crate>/fuzz/seeds/<target>/)"
    )]
    NoSeeds(PathBuf),
    /// A seed or corpus file cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Runs `run` on every file of `<crate_dir>/fuzz/seeds/<target>/`, then of the local corpus
/// `<crate_dir>/fuzz/corpus/<target>/` if there is one, in name order; returns how many inputs
/// ran. A target without seeds is an error, not a skip. A panic in `run` (what libFuzzer would
/// report as a crash) names the input on stderr first.
pub fn replay(crate_dir: &Path, target: &str, run: fn(&[u8])) -> Result<usize, SeedError> {
    let seed_dir = crate_dir.join("fuzz/seeds").join(target);
    let seeds = files(&seed_dir)?;
    if seeds.is_empty() {
        return Err(SeedError::NoSeeds(seed_dir));
    }
    let corpus = files(&crate_dir.join("fuzz/corpus").join(target))?;
    for path in seeds.iter().chain(&corpus) {
        let data = std::fs::read(path).map_err(|source| SeedError::Read {
            path: path.clone(),
            source,
        })?;
        eprintln!(
            "fuzz seeds: {target}: {} ({} bytes)",
            path.display(),
            data.len()
        );
        run(&data);
    }
    Ok(seeds.len() + corpus.len())
}

/// [`replay`] for a crate's `tests/fuzz_seeds.rs` (`crate_dir` is its `CARGO_MANIFEST_DIR`):
/// a target without seeds, or a seed that cannot be read, fails the test by name.
#[allow(clippy::panic)]
pub fn replay_or_fail(crate_dir: &str, target: &str, run: fn(&[u8])) {
    if let Err(e) = replay(Path::new(crate_dir), target, run) {
        panic!("fuzz seeds of {target}: {e}");
    }
}

/// The files of `dir`, sorted; none if it does not exist.
fn files(dir: &Path) -> Result<Vec<PathBuf>, SeedError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(SeedError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|source| SeedError::Read {
                path: dir.to_path_buf(),
                source,
            })?
            .path();
        if path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(data: &[u8]) {
        assert!(!data.is_empty());
    }

    #[test]
    fn seeds_then_corpus_and_no_seeds_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            replay(dir.path(), "t", count),
            Err(SeedError::NoSeeds(_))
        ));
        std::fs::create_dir_all(dir.path().join("fuzz/seeds/t")).unwrap();
        assert!(matches!(
            replay(dir.path(), "t", count),
            Err(SeedError::NoSeeds(_))
        ));
        std::fs::write(dir.path().join("fuzz/seeds/t/a"), b"seed").unwrap();
        assert_eq!(replay(dir.path(), "t", count).unwrap(), 1);
        std::fs::create_dir_all(dir.path().join("fuzz/corpus/t")).unwrap();
        std::fs::write(dir.path().join("fuzz/corpus/t/b"), b"grown").unwrap();
        assert_eq!(replay(dir.path(), "t", count).unwrap(), 2);
    }

    #[test]
    #[should_panic(expected = "crash")]
    fn a_crashing_input_fails_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("fuzz/seeds/t")).unwrap();
        std::fs::write(dir.path().join("fuzz/seeds/t/a"), b"x").unwrap();
        let _ = replay(dir.path(), "t", |_| panic!("crash"));
    }
}
