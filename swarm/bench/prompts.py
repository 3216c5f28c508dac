"""The fixed prompt every setup gets (a plain completion, ~200 tokens with SmolLM2's tokenizer)."""

PROMPT = (
    "The lighthouse keeper's log, autumn. The storm came in from the west just after the evening lamp was lit. "
    "By midnight the waves were breaking over the lower gallery and the glass of the lantern room rattled in its "
    "frame. I trimmed the wick twice, wound the clockwork that turns the lens, and watched for ships. Around two "
    "in the morning a small fishing boat appeared between the rocks, its single light swinging wildly. I rang the "
    "fog bell and burned a flare so the crew could see the reef. They turned north, toward the harbour, and I lost "
    "sight of them in the rain. At dawn the sea was grey and calm, as if nothing had happened. I walked down to the "
    "shore and found a wooden crate washed up on the sand. Inside it, wrapped in oilcloth, was a letter addressed "
    "to my grandfather, who kept this light fifty years ago. I sat on the rocks and opened it. The letter said"
)
