"""Flight participant: books and cancels a flight per saga step."""
