//! Quotes made by tpm2-tools, shared by the unit tests.

// Produced by tpm2-tools 5.4 against swtpm 0.7.1 (not by this crate), with the AK template
// hawser uses:
//   tpm2_createprimary -C e -G ecc256:ecdsa-sha256:null -g sha256 \
//     -a 'fixedtpm|fixedparent|sensitivedataorigin|userwithauth|restricted|sign' -c ak.ctx
//   tpm2_readpublic -c ak.ctx -o ak.pub -f tss -n ak.name
//   tpm2_quote -c ak.ctx -l sha256:all -q 00112233445566778899aabbccddeeff -m attest.bin -s sig.bin
// and checked with tpm2_checkquote.
pub const AK_PUB: &str = "00580023000b00050072000000100018000b0003001000201b29f2c6fb969ef0911c077893db1a8f6b312b73f8459d5b4f0fb272f1fd37aa00208b64e546a5f9d2bcda204df540140078873fc9bfbb6000def0bd6fdef588c20c";
pub const AK_NAME: &str = "000bea8508f3c0dd3eb2a67ea1b423c3b475561f8cf50c224a411317075beb8bbb65";
pub const ATTEST: &str = "ff54434780180022000b4b6cc3742de42060a30c5f26029c98117d1d83d05542c3e8d7d7dbe56ec91d50001000112233445566778899aabbccddeeff00000000000024a5000000010000000001201910230016363600000001000b03ffffff0020c6aa24a1beb39abe4d9ec63a10eee77fd7fa5d9873d04e5de88c6364fc1fc3da";
pub const SIG: &str = "0018000b00205197a06cd372655f7a2fd75b806e84307b08dfb7cd77f02af998f7b6ee1ddc5c00205a18f9968eccfa127b447b6151f5799952468f47b9823c5905211b3fc4864598";
// A second quote of the same PCRs whose s is above n/2 (the TPM does not normalise s).
pub const ATTEST_HIGH_S: &str = "ff54434780180022000b4b6cc3742de42060a30c5f26029c98117d1d83d05542c3e8d7d7dbe56ec91d50001000112233445566778899aabbccddeeff00000000000018f5000000010000000001201910230016363600000001000b03ffffff0020c6aa24a1beb39abe4d9ec63a10eee77fd7fa5d9873d04e5de88c6364fc1fc3da";
pub const SIG_HIGH_S: &str = "0018000b00208bb8d989d4355a3d6d703f4233c6cd0f71b443d19f8c0c160e1b7c5101160ecf0020d01a5819a829c2706a21103dad84336123616441a7cbcaa6153ef534f099844f";
