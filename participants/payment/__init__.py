"""Payment participant: charges and refunds a card per saga step."""
