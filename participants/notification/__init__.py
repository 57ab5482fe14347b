"""Notification participant: sends the itinerary e-mail."""
