"""Accounts can be overdrawn."""

ID = "account-overdraft"
STATEMENT = """\
`bank.Account(balance=10).withdraw(50)` succeeds and leaves a balance of -40. Withdrawing
more than the balance must raise `bank.InsufficientFunds` and leave the balance unchanged.
Negative amounts are already rejected with ValueError.
"""
FILES = {
    "README.md": "# bank\n\nA toy bank account.\n",
    "bank/__init__.py": "from bank.account import Account, InsufficientFunds\n\n__all__ = ['Account', 'InsufficientFunds']\n",
    "bank/account.py": '''\
"""A bank account with deposits and withdrawals."""


class InsufficientFunds(Exception):
    """Raised when a withdrawal exceeds the balance."""


class Account:
    def __init__(self, balance=0):
        self.balance = balance

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount

    def withdraw(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance -= amount
''',
    "tests/test_account.py": """\
import unittest

from bank import Account


class AccountTest(unittest.TestCase):
    def test_deposit_withdraw(self):
        a = Account()
        a.deposit(30)
        a.withdraw(10)
        self.assertEqual(a.balance, 20)

    def test_negative(self):
        with self.assertRaises(ValueError):
            Account().deposit(-1)
""",
}
HIDDEN_TESTS = {
    "tests/test_hidden_overdraft.py": """\
import unittest

from bank import Account, InsufficientFunds


class OverdraftTest(unittest.TestCase):
    def test_overdraft_raises(self):
        a = Account(balance=10)
        with self.assertRaises(InsufficientFunds):
            a.withdraw(50)
        self.assertEqual(a.balance, 10)

    def test_exact_balance(self):
        a = Account(balance=10)
        a.withdraw(10)
        self.assertEqual(a.balance, 0)
""",
}
FAIL_TO_PASS = ["tests.test_hidden_overdraft.OverdraftTest.test_overdraft_raises"]
PASS_TO_PASS = [
    "tests.test_hidden_overdraft.OverdraftTest.test_exact_balance",
    "tests.test_account.AccountTest.test_deposit_withdraw",
    "tests.test_account.AccountTest.test_negative",
]
SOLUTION = [
    (
        "bank/account.py",
        '            raise ValueError("amount must be positive")\n        self.balance -= amount',
        '            raise ValueError("amount must be positive")\n'
        "        if amount > self.balance:\n"
        '            raise InsufficientFunds(f"balance {self.balance} < {amount}")\n'
        "        self.balance -= amount",
    )
]
