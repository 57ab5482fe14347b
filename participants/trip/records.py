"""The trip's records, as pydantic models: its input and what each step gives (``saga schemas write`` writes
their Avro schemas into ``inputs/`` and ``outputs/`` beside this module)."""

from __future__ import annotations

from pydantic import BaseModel


class TripRequest(BaseModel):
    """Input of saga type 'trip' (``saga.v1.trip.TripRequest``; its fields in this order are its 0.1 record)."""

    customer_id: str
    origin: str
    destination: str
    depart_date: str  # ISO-8601 date
    return_date: str  # ISO-8601 date
    currency: str  # ISO-4217 code
    card_token: str
    email: str
    amount_cents: int


class FlightBooking(BaseModel):
    """What book_flight gives: the booking's row."""

    booking_id: int


class HotelBooking(BaseModel):
    """What book_hotel gives: the booking's row."""

    booking_id: int


class Charge(BaseModel):
    """What charge_card gives: the charge's row."""

    charge_id: int


class Itinerary(BaseModel):
    """What send_itinerary gives: the row of the message sent."""

    sent_id: int


class Cancellation(BaseModel):
    """What cancel_flight and cancel_hotel give: the bookings they cancelled (none when there was none)."""

    cancelled_booking_ids: list[int]


class Refund(BaseModel):
    """What refund_card gives: the charges it refunded (none when there was none)."""

    refunded_charge_ids: list[int]
