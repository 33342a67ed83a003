"""The negatives probe: which scenes it asks about, and that it reads whether the image prefers the caption."""

from __future__ import annotations

import torch
from conftest import tiny_training_data

from components.study import negatives_probe as probe


class _Judge:
    """A model that embeds every image alike and a text by whether it is a scene's own caption (or a negative that is
    one of the captions, word for word): it prefers the captions (``right``) or their negatives."""

    def __init__(self, captions: set[str], right: bool):
        self.captions, self.right, self.texts = captions, right, []

    def tokenizer(self, texts):
        start = len(self.texts)
        self.texts += list(texts)
        return torch.arange(start, start + len(texts))

    def encode_image(self, images, normalize=True):
        return torch.tensor([[1.0, 0.0]]).repeat(len(images), 1)

    def encode_text(self, ids, normalize=True):
        near = torch.tensor([self.texts[i] in self.captions for i in ids.tolist()]) == self.right
        return torch.stack([near.float(), (~near).float()], dim=1)


def test_the_share_is_how_often_the_image_prefers_its_caption_over_its_swap(tmp_path):
    root = tiny_training_data(tmp_path, test_images=20)
    scenes = probe.crowded_scenes(str(root / "captions" / "train" / "*.tar"), 30)
    assert 0 < len(scenes) <= 30 and all(len(meta["objects"]) > 1 for _, meta in scenes)
    captions = {meta["captions"]["short"] for _, meta in scenes}
    preprocess = lambda image: torch.zeros(3, 4, 4)  # noqa: E731 - the judge ignores pixels
    shares = {}
    for right in (True, False):
        judge = _Judge(captions, right)
        shares[right], n = probe.prefers_caption(judge, preprocess, judge.tokenizer, scenes, "short")
        assert 0 < n <= len(scenes)  # a scene whose caption has no swap is left out
    # a swap that is word for word another scene's caption ties with its caption (counted wrong): nearly all, not all
    assert shares[True] > 0.85 and shares[False] == 0.0
    assert probe.main(["--model", "x=unused", "--train-shards", str(tmp_path / "none" / "*.tar")]) == 2
