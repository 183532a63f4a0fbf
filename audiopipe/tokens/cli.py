"""`audiopipe tokens`: its flags and the run that picks the semantic-token source (name2semantic tsv or k-means)."""

from __future__ import annotations

import argparse

from audiopipe.errors import InvalidValue



def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `audiopipe tokens`."""
    p.add_argument("--shards", required=True, help="shard folder with phones (and the k-means feature)")
    p.add_argument("--out", required=True, help="new folder for the semantic-token shards (a sidecar shard set)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--name2semantic", metavar="FILE",
                     help="GPT-SoVITS 6-name2semantic.tsv (item_name<TAB>space-separated ints), joined by "
                          "utterance name (basename of the id)")
    src.add_argument("--kmeans", type=int, metavar="K",
                     help="fit K k-means units on --feature and tokenise every utterance (NOT GPT-SoVITS's own "
                          "semantic tokens)")
    src.add_argument("--codebook", metavar="NPZ", help="tokenise with a codebook saved by an earlier --kmeans run")
    p.add_argument("--codebook-size", type=int, default=1024,
                   help="name2semantic: token ids must be below this (SoVITS: 1024)")
    p.add_argument("--token-rate", type=float, default=25.0,
                   help="name2semantic: tokens per second (SoVITS v1/v2: 25); used for the length check")
    p.add_argument("--require-all", action="store_true",
                   help="name2semantic: exit 1 when any row or tsv name is left unmatched")
    p.add_argument("--feature", default="auto",
                   help="kmeans: the feature to cluster (fbank, mel, or another shard column); auto (default): the "
                        "fbank when the shards hold one, else the mel, else any float [channels, T] feature")
    p.add_argument("--stack", type=int, default=0,
                   help="kmeans: frames stacked per token (default 0 = auto, to about 25 tokens/s)")
    p.add_argument("--seed", type=int, default=0, help="kmeans: seed of sampling, init and mini-batches")
    p.add_argument("--fit-vectors", type=int, default=200_000, help="kmeans: at most this many vectors to fit on")
    p.add_argument("--steps", type=int, default=200, help="kmeans: mini-batch steps (default 200)")
    p.add_argument("--batch-size", type=int, default=4096, help="kmeans: vectors per mini-batch (default 4096)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing semantic-token folder at --out")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it goes to stderr)")


def run(args: argparse.Namespace) -> int:
    """`audiopipe tokens`: returns the exit code; user errors raise InvalidValue/OSError with one-line messages."""
    if args.name2semantic:
        from audiopipe.tokens.semantic import import_name2semantic

        summary = import_name2semantic(args.shards, args.name2semantic, args.out, codebook_size=args.codebook_size,
                                       token_rate=args.token_rate, force=args.overwrite)
        for line in summary.lines():
            print(line)
        return 1 if args.require_all and not summary.complete else 0
    from audiopipe.tokens.kmeans import kmeans_tokens

    if args.kmeans is not None and args.kmeans < 2:
        raise InvalidValue(f"--kmeans needs at least 2 clusters, got {args.kmeans}")
    summary = kmeans_tokens(args.shards, args.out, k=args.kmeans, feature=args.feature, stack=args.stack,
                            seed=args.seed, fit_vectors=args.fit_vectors, steps=args.steps,
                            batch_size=args.batch_size, codebook=args.codebook, force=args.overwrite,
                            progress=not getattr(args, "no_progress", False))
    for line in summary:
        print(line)
    return 0
