"""Hotel participant: books and cancels a hotel room per saga step."""
