"""Operations that run beside turns: the expiry sweep and tenant erasure, export and
import, notifications of calls that wait for a person.
"""
