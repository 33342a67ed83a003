"""A model folder for the Hugging Face Hub, and its upload: what open_clip's ``push_to_hf_hub`` writes
(``open_clip_config.json``, ``open_clip_model.safetensors``, the tokenizer's files when an export holds them, and the
model card as ``README.md``), from one of our exports, so that ``open_clip.create_model_and_transforms("hf-hub:<repo>")``
loads it. The register stage's ``--publish`` calls it with the card completed by the benchmark suite's figures.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from components.shared.atomic import CHECKSUMS_FILE
from components.shared.checkpoints import EXPORT_CONFIG, check_export
from components.shared.model_card import CARD_FILE, is_hub_id
from components.shared.written import ForeignFilesError, Ledger, check_replaceable, place_of, replace_folder

PUBLISH_STAGE = "publish"  # its record (.c2lip-publish-outputs.json) in every folder this writes: never uploaded
# What a published folder may hold, by name: open_clip's config and weights, a tokenizer's files, and the card (written
# here). Anything else in an export folder (a `.env`, notes, our checksums) is never copied, and a link never followed.
PUBLISHED_FILES = (EXPORT_CONFIG, "open_clip_model.safetensors", "open_clip_pytorch_model.bin", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt",
                   "merges.txt", "spiece.model", "sentencepiece.bpe.model")


class PublishError(ValueError):
    """A folder or repository that cannot be published to: says which, and why."""


def hub_folder(export: Path, card: str, out: Path) -> Path:
    """``out`` holding the export's files and ``card`` as README.md, written whole under a temporary name then renamed
    into place. ``out`` must be new, empty, or hold only what a publish recorded writing there (unchanged): nothing of
    a user's is replaced."""
    export, out = Path(export), Path(out)
    if out.is_symlink():
        raise PublishError(f"{out}: a symbolic link; name a real folder (nothing was changed)")
    if next((p for p in out.parents if p.exists() and not p.is_dir()), None) is not None:
        raise PublishError(f"{out}: a path under a file, not a folder (nothing was changed)")
    if not (export / EXPORT_CONFIG).is_file():
        raise PublishError(f"{export}: no {EXPORT_CONFIG}; publish an export folder (the train stage's models/train/export)")
    check_export(export)  # checksums and a readable safetensors file, else the damaged file is named
    try:
        check_replaceable(out, "publish")
    except ForeignFilesError as err:
        raise PublishError(str(err)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.c2lip-build-", dir=out.parent))
    try:
        for name in PUBLISHED_FILES:
            file = export / name
            if file.is_symlink():  # a link could point anywhere on this machine: its target is never uploaded
                raise PublishError(f"{file}: a symbolic link; an export to publish holds its files themselves (nothing was changed)")
            if file.is_file():
                shutil.copy2(file, build / name)
        left_out = sorted(p.name for p in export.iterdir() if p.name not in (*PUBLISHED_FILES, CARD_FILE, CHECKSUMS_FILE))
        if left_out:
            print(f"publish: not copied from {export} (not a model file): {', '.join(left_out)}", file=sys.stderr)
        (build / CARD_FILE).write_text(card)
        Ledger(build, PUBLISH_STAGE, place=place_of(out)).record(p.name for p in build.iterdir())
        replace_folder(build, out, "publish")
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return out


def upload(folder: Path, repo_id: str, private: bool = True, api=None) -> str:
    """Upload ``folder`` to the Hub model repository ``repo_id`` (created when missing, private by default) with
    huggingface_hub; the token is huggingface_hub's own (HF_TOKEN or `hf auth login`). Returns the commit's URL."""
    if not is_hub_id(repo_id):
        raise PublishError(f"--repo-id {repo_id!r}: not a Hub repository id (owner/name)")
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model", ignore_patterns=[".c2lip-*"],
                                   commit_message="Upload a c2lip model (open_clip export and model card)")
    except Exception as err:  # offline, no token, no rights: one line naming the repository
        raise PublishError(f"--repo-id {repo_id}: the upload failed: {str(err).splitlines()[0][:300] if str(err) else type(err).__name__}") from None
    return str(getattr(commit, "commit_url", commit))
