//! An IVF-PQ index over unit vectors: a coarse k-means quantiser splits the vectors into
//! `lists`; each vector's residual to its list's centroid is product-quantised into `subspaces`
//! one-byte codes (codebooks of up to 256 centroids per subspace, trained on the residuals). A
//! query scans the `probe` nearest lists with asymmetric distances (the exact query residual against
//! the codebooks: one table per list, then one lookup per code); [`IvfPq::search_reranked`]
//! re-ranks a shortlist with exact distances from vectors the caller holds. The index keeps no
//! vector: `subspaces` bytes and a 4-byte id a vector (384-d f32: 1,536 bytes flat; at 48
//! subspaces 52 bytes, 1/29), plus its centroids and codebooks.
//!
//! Our own small implementation rather than a crate: it is ~200 lines over [`super::kmeans`],
//! deterministic from a seed (the same pool gives the same index, so snapshots and tests are
//! stable), has no unsafe code, and adds nothing to the gateway's build. What it assumes:
//! vectors are compared by Euclidean distance, which ranks unit vectors exactly as cosine does.

use super::kmeans::{kmeans, nearest, squared_distance};

/// Largest codebook per subspace: one byte per code.
pub const MAX_CODEBOOK: usize = 256;

/// How an index is built and searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IvfPqParams {
    /// Coarse lists; 0 = ⌈√n⌉ (the usual IVF choice: lists and list lengths balanced).
    pub lists: usize,
    /// Product-quantiser subspaces; must divide the dimension.
    pub subspaces: usize,
    /// Centroids per subspace codebook, 1..=[`MAX_CODEBOOK`] (a code is one byte either way).
    pub codebook: usize,
    /// Lists scanned per query.
    pub probe: usize,
    /// Lloyd iterations of each k-means.
    pub iterations: usize,
    /// Most vectors the quantisers are trained on (a seeded sample beyond it).
    pub max_train: usize,
    pub seed: u64,
}

impl Default for IvfPqParams {
    fn default() -> Self {
        Self {
            lists: 0,
            subspaces: 48,
            codebook: MAX_CODEBOOK,
            probe: 8,
            iterations: 8,
            max_train: 20_000,
            seed: 0x0069_7666_7071,
        }
    }
}

/// Why an index could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("dimension {dim} is not a multiple of subspaces {subspaces}")]
    Subspaces { dim: usize, subspaces: usize },
    #[error("{len} values are not whole vectors of dimension {dim}")]
    Ragged { len: usize, dim: usize },
    #[error("more than {} vectors", u32::MAX)]
    TooMany,
    #[error("codebook {0}: must be 1..=256")]
    Codebook(usize),
}

/// The built index.
#[derive(Debug, Clone)]
pub struct IvfPq {
    dim: usize,
    params: IvfPqParams,
    /// `lists × dim` coarse centroids.
    coarse: Vec<f32>,
    /// `subspaces × codebook × sub_dim` codebooks.
    codebooks: Vec<f32>,
    /// Per list: the ids of its vectors and their codes (`subspaces` bytes each).
    ids: Vec<Vec<u32>>,
    codes: Vec<Vec<u8>>,
}

impl IvfPq {
    /// Builds the index of `vectors` (flat rows of `dim`); ids are row numbers.
    pub fn build(vectors: &[f32], dim: usize, params: IvfPqParams) -> Result<Self, IndexError> {
        if dim == 0 || params.subspaces == 0 || !dim.is_multiple_of(params.subspaces) {
            return Err(IndexError::Subspaces {
                dim,
                subspaces: params.subspaces,
            });
        }
        if !(1..=MAX_CODEBOOK).contains(&params.codebook) {
            return Err(IndexError::Codebook(params.codebook));
        }
        if !vectors.len().is_multiple_of(dim) {
            return Err(IndexError::Ragged {
                len: vectors.len(),
                dim,
            });
        }
        let n = vectors.len() / dim;
        if u32::try_from(n).is_err() {
            return Err(IndexError::TooMany);
        }
        let lists = if params.lists == 0 {
            ((n as f64).sqrt().ceil() as usize).max(1)
        } else {
            params.lists
        };
        let sample = training_sample(vectors, dim, params.max_train, params.seed);
        let coarse = kmeans(&sample, dim, lists, params.iterations, params.seed);
        let residuals: Vec<f32> = sample
            .chunks_exact(dim)
            .flat_map(|v| {
                let (list, _) = nearest(&coarse, dim, v);
                residual(v, &coarse[list * dim..(list + 1) * dim])
            })
            .collect();
        let sub = dim / params.subspaces;
        let book_len = params.codebook * sub;
        let mut codebooks = Vec::with_capacity(params.subspaces * book_len);
        for s in 0..params.subspaces {
            let part: Vec<f32> = residuals
                .chunks_exact(dim)
                .flat_map(|r| r[s * sub..(s + 1) * sub].iter().copied())
                .collect();
            codebooks.extend(kmeans(
                &part,
                sub,
                params.codebook,
                params.iterations,
                params.seed ^ s as u64,
            ));
        }
        let mut index = Self {
            dim,
            params: IvfPqParams { lists, ..params },
            coarse,
            codebooks,
            ids: vec![Vec::new(); lists],
            codes: vec![Vec::new(); lists],
        };
        for (id, v) in vectors.chunks_exact(dim).enumerate() {
            index.add(id as u32, v);
        }
        Ok(index)
    }

    fn add(&mut self, id: u32, v: &[f32]) {
        let dim = self.dim;
        let (list, _) = nearest(&self.coarse, dim, v);
        let r = residual(v, &self.coarse[list * dim..(list + 1) * dim]);
        let sub = dim / self.params.subspaces;
        let book_len = self.params.codebook * sub;
        for (s, part) in r.chunks_exact(sub).enumerate() {
            let book = &self.codebooks[s * book_len..(s + 1) * book_len];
            self.codes[list].push(nearest(book, sub, part).0 as u8);
        }
        self.ids[list].push(id);
    }

    /// Vectors indexed.
    pub fn len(&self) -> usize {
        self.ids.iter().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn params(&self) -> IvfPqParams {
        self.params
    }

    /// Bytes the index holds (centroids, codebooks, ids and codes).
    pub fn bytes(&self) -> usize {
        let floats = self.coarse.len() + self.codebooks.len();
        floats * 4 + self.len() * (4 + self.params.subspaces)
    }

    /// The `k` nearest ids to `query` with their estimated squared distances, nearest first,
    /// scanning `probe` lists (the built default when `None`).
    pub fn search(&self, query: &[f32], k: usize, probe: Option<usize>) -> Vec<(u32, f32)> {
        if query.len() != self.dim || k == 0 {
            return Vec::new();
        }
        let dim = self.dim;
        let sub = dim / self.params.subspaces;
        let mut lists: Vec<(usize, f32)> = self
            .coarse
            .chunks_exact(dim)
            .map(|c| squared_distance(c, query))
            .enumerate()
            .collect();
        lists.sort_by(|a, b| a.1.total_cmp(&b.1));
        let mut found: Vec<(u32, f32)> = Vec::new();
        let book = self.params.codebook;
        let book_len = book * sub;
        let mut table = vec![0.0f32; self.params.subspaces * book];
        for &(list, _) in lists.iter().take(probe.unwrap_or(self.params.probe).max(1)) {
            let r = residual(query, &self.coarse[list * dim..(list + 1) * dim]);
            for (s, part) in r.chunks_exact(sub).enumerate() {
                let codebook = &self.codebooks[s * book_len..(s + 1) * book_len];
                for (c, centroid) in codebook.chunks_exact(sub).enumerate() {
                    table[s * book + c] = squared_distance(part, centroid);
                }
            }
            let codes = self.codes[list].chunks_exact(self.params.subspaces);
            for (id, code) in self.ids[list].iter().zip(codes) {
                let d: f32 = code
                    .iter()
                    .enumerate()
                    .map(|(s, c)| table[s * book + usize::from(*c)])
                    .sum();
                found.push((*id, d));
            }
        }
        top_k(found, k)
    }
}

impl IvfPq {
    /// [`IvfPq::search`] for `rerank × k` candidates, re-ranked by `distance` (the exact
    /// squared distance of an id, from vectors the caller holds): PQ's quantisation error
    /// reorders near neighbours, the shortlist rarely misses them.
    pub fn search_reranked(
        &self,
        query: &[f32],
        k: usize,
        probe: Option<usize>,
        rerank: usize,
        distance: impl Fn(u32) -> Option<f32>,
    ) -> Vec<(u32, f32)> {
        let shortlist = self.search(query, k.saturating_mul(rerank.max(1)), probe);
        let exact = shortlist
            .into_iter()
            .filter_map(|(id, _)| distance(id).map(|d| (id, d)))
            .collect();
        top_k(exact, k)
    }
}

fn residual(v: &[f32], centroid: &[f32]) -> Vec<f32> {
    v.iter().zip(centroid).map(|(x, c)| x - c).collect()
}

/// At most `max` rows of `vectors`, a seeded sample when there are more.
fn training_sample(vectors: &[f32], dim: usize, max: usize, seed: u64) -> Vec<f32> {
    let n = vectors.len() / dim;
    if n <= max {
        return vectors.to_vec();
    }
    let mut state = seed;
    let mut picks: Vec<usize> = (0..n).collect();
    for i in 0..max {
        let j = i + (super::kmeans::splitmix64(&mut state) % (n - i) as u64) as usize;
        picks.swap(i, j);
    }
    picks[..max]
        .iter()
        .flat_map(|&i| vectors[i * dim..(i + 1) * dim].iter().copied())
        .collect()
}

/// The `k` smallest by distance, nearest first (ties by id, so results are stable).
pub fn top_k(mut found: Vec<(u32, f32)>, k: usize) -> Vec<(u32, f32)> {
    found.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    found.truncate(k);
    found
}

/// Exact search: the `k` nearest rows of `vectors` to `query`.
pub fn exact(vectors: &[f32], dim: usize, query: &[f32], k: usize) -> Vec<(u32, f32)> {
    let found = vectors
        .chunks_exact(dim)
        .enumerate()
        .map(|(i, v)| (i as u32, squared_distance(v, query)))
        .collect();
    top_k(found, k)
}

#[cfg(test)]
mod tests;
